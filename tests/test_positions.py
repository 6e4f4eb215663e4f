"""Canvas M-RoPE positions: ggufbridge's `canvas_positions` against transformers' `get_rope_index` (the
reference implementation of MiniCPM-V 4.7) on the same token sequences."""

from __future__ import annotations

import numpy as np
import pytest

from ggufbridge.errors import VisionModelError
from ggufbridge.vision.positions import Markers, canvas_positions, stretch


@pytest.fixture(scope="module")
def hf_model():
    from transformers import MiniCPMV4_7Model

    from ggufbridge.fixtures.checkpoint import build_config, get_spec

    return MiniCPMV4_7Model(build_config(get_spec("tiny"), vocab="small")).eval()


@pytest.fixture(scope="module")
def markers(hf_model):
    c = hf_model.config
    return Markers(c.image_start_id, c.image_end_id, c.slice_start_id, c.slice_end_id, c.newline_id)


class Layout:
    """Builds a token sequence the way the MiniCPM-V 4.7 processor lays out images."""

    def __init__(self, markers: Markers, image_token: int, seed: int = 0):
        self.m, self.img = markers, image_token
        self.rng = np.random.default_rng(seed)
        bad = markers.all | {image_token}
        self.words = [t for t in range(3, 400) if t not in bad]
        self.ids: list[int] = []
        self.visual: list[bool] = []
        self.grids: list[tuple[int, int]] = []

    def text(self, n: int):
        for t in self.rng.choice(self.words, n):
            self._add(int(t))
        return self

    def newline(self):
        self._add(self.m.newline)
        return self

    def image(self, thumb, grid=None, cell=None, image_id: bool = True):
        if image_id:  # `<image_id>N</image_id>` is plain text to the position rule
            self.text(3)
        self._add(self.m.image_start)
        self._crop(thumb)
        self._add(self.m.image_end)
        if grid:
            rows, cols = grid
            for r in range(rows):
                if r:
                    self._add(self.m.newline)
                for _ in range(cols):
                    self._add(self.m.slice_start)
                    self._crop(cell)
                    self._add(self.m.slice_end)
        return self

    def _crop(self, g):
        self.grids.append(tuple(g))
        for _ in range(g[0] * g[1]):
            self._add(self.img, True)

    def _add(self, t, vis=False):
        self.ids.append(t)
        self.visual.append(vis)


def _hf(model, lay: Layout, merge: int):
    import torch

    ids = torch.tensor([lay.ids])
    tt = torch.tensor([[1 if v else 0 for v in lay.visual]])
    ts = torch.tensor([[h * merge, w * merge] for h, w in lay.grids])
    pos, delta = model.get_rope_index(ids, mm_token_type_ids=tt, target_sizes=ts,
                                      downsample_mode="4x" if merge == 2 else "16x")
    return pos[:, 0].numpy(), int(delta[0, 0]) + len(lay.ids)


def _check(model, markers, lay: Layout, merge: int = 4):
    want, want_next = _hf(model, lay, merge)
    got, nxt = canvas_positions(lay.ids, lay.visual, lay.grids, markers)
    np.testing.assert_array_equal(got, want)
    assert nxt == want_next


def _lay(hf_model, markers, seed=0):
    return Layout(markers, hf_model.config.image_token_id, seed)


def test_single_unsliced_image(hf_model, markers):
    _check(hf_model, markers, _lay(hf_model, markers).text(5).image((2, 3)).text(4))


@pytest.mark.parametrize("grid", [(1, 2), (2, 1), (3, 3), (2, 3)])
def test_sliced_image(hf_model, markers, grid):
    # thumbnail grid differs from the canvas: it is stretched over rows·2 × cols·2
    _check(hf_model, markers, _lay(hf_model, markers).text(4).image((1, 3), grid, (2, 2)).newline().text(6))


def test_several_images_and_text_after(hf_model, markers):
    lay = _lay(hf_model, markers).text(3).image((2, 2)).text(2).image((1, 3), (2, 2), (2, 1)).newline()
    lay.image((3, 2), (1, 3), (1, 2)).text(7)
    _check(hf_model, markers, lay)


def test_adjacent_frames_share_a_group(hf_model, markers):
    """Frames separated only by markers (no `<image_id>` text): the later frame's halo must not land on the
    previous frame's tokens (the reference adds one step)."""
    lay = _lay(hf_model, markers).text(2).image((2, 2), image_id=False).newline().image((2, 2), (1, 2), (1, 1),
                                                                                          image_id=False)
    _check(hf_model, markers, lay.text(3))


def test_4x_merge_factor(hf_model, markers):
    _check(hf_model, markers, _lay(hf_model, markers).text(2).image((4, 6), (2, 2), (4, 4)).text(2), merge=2)


def test_image_first_and_last(hf_model, markers):
    _check(hf_model, markers, _lay(hf_model, markers).image((2, 2), (1, 2), (2, 2), image_id=False))


def test_random_layouts(hf_model, markers):
    rng = np.random.default_rng(7)
    for seed in range(40):
        lay = _lay(hf_model, markers, seed)
        for _ in range(rng.integers(1, 4)):
            lay.text(int(rng.integers(0, 4)))
            if rng.random() < 0.3:
                lay.newline()
            thumb = tuple(int(x) for x in rng.integers(1, 5, 2))
            if rng.random() < 0.6:
                grid = tuple(int(x) for x in rng.integers(1, 4, 2))
                if grid == (1, 1):
                    grid = (1, 2)
                lay.image(thumb, grid, tuple(int(x) for x in rng.integers(1, 4, 2)), image_id=rng.random() < 0.7)
            else:
                lay.image(thumb, image_id=rng.random() < 0.7)
        lay.text(int(rng.integers(0, 3)))
        _check(hf_model, markers, lay, merge=int(rng.choice([2, 4])))


def test_stretch_matches_torch_linspace():
    import torch

    for n in range(1, 40):
        for extent in range(1, 60):
            want = torch.linspace(0, extent - 1, n).round().long().numpy()
            np.testing.assert_array_equal(stretch(n, extent), want, err_msg=f"n={n} extent={extent}")


def test_grid_count_mismatch_is_an_error(markers, hf_model):
    lay = _lay(hf_model, markers).text(2).image((2, 2))
    with pytest.raises(VisionModelError, match="1 visual runs in the prompt but 2 crop grids"):
        canvas_positions(lay.ids, lay.visual, lay.grids + [(1, 1)], markers)
    with pytest.raises(VisionModelError, match="does not fill its 1×3 token grid"):
        canvas_positions(lay.ids, lay.visual, [(1, 3)], markers)
