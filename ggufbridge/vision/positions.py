"""MiniCPM-V 4.7 canvas M-RoPE positions (t, h, w per token), as the model was trained with.

Rules (MiniCPM-V 4.7 `get_rope_index`, transformers 5.23, restated):
* text is 1-D: t = h = w = running position;
* a *frame* is `<image>` thumbnail `</image>` followed by its slices (`<slice>` crop `</slice>`, rows joined by
  a newline). All its tokens share t = origin (the running position when the frame starts). The canvas is the
  slice grid in LLM tokens (rows·slice_h × cols·slice_w), or the thumbnail's own grid without slices;
* thumbnail tokens are stretched over the canvas (rounded linspace), slice tokens sit at their slice offset;
* `<image>` → (origin−1, origin−1) in (h, w); `</image>` → the far canvas corner; `<slice>`/`</slice>` → the
  slice's first/last cell; a row newline → just right of the row's last cell;
* after a frame the running position jumps to origin + max(canvas_h, canvas_w) + 1;
* frames separated only by marker tokens form one group; tokens between two frames of a group are 1-D and
  cost one extra step.
Positions are computed from token ids plus a per-token "is visual" flag, the same inputs the model uses.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ggufbridge.errors import VisionModelError


@dataclass(frozen=True)
class Markers:
    image_start: int
    image_end: int
    slice_start: int
    slice_end: int
    newline: int

    @property
    def all(self) -> frozenset[int]:
        return frozenset((self.image_start, self.image_end, self.slice_start, self.slice_end, self.newline))


@dataclass
class _Frame:
    thumb: tuple[int, int]  # [start, end) of the thumbnail's visual tokens
    slices: list[tuple[int, int]]
    end: int = 0  # one past the markers closing the frame


def stretch(n: int, extent: int) -> np.ndarray:
    """`n` integer coordinates spread over 0..extent-1: float32 linspace rounded half-to-even (bit-compatible
    with torch.linspace: the first half counts up from 0, the second half down from extent-1)."""
    if n == 1:
        return np.zeros(1, dtype=np.int64)
    step = np.float32(extent - 1) / np.float32(n - 1)
    i = np.arange(n)
    up = np.float32(0) + step * i.astype(np.float32)
    down = np.float32(extent - 1) - step * (n - 1 - i).astype(np.float32)
    vals = np.where(i < n // 2, up, down).astype(np.float32)
    return np.rint(vals).astype(np.int64)


def _frames(ids: list[int], visual: list[bool], m: Markers) -> list[tuple[int, list[_Frame]]]:
    """Group the visual runs into frames and frames into groups: [(index of the group's `<image>`, frames)]."""
    marks = m.all
    groups: list[tuple[int, list[_Frame]]] = []
    frame: _Frame | None = None
    prev_end = 0
    i, n = 0, len(ids)
    while i < n:
        if not visual[i]:
            i += 1
            continue
        j = i
        while j < n and visual[j]:
            j += 1
        if frame is not None and i > 0 and ids[i - 1] == m.slice_start:
            frame.slices.append((i, j))
        else:
            frame = _Frame((i, j), [])
            between = ids[prev_end:i - 1]
            if groups and all(t in marks for t in between):
                groups[-1][1].append(frame)
            else:
                groups.append((i - 1, [frame]))
        prev_end = j
        i = j
    for _, frames in groups:
        for f in frames:
            end = f.slices[-1][1] if f.slices else f.thumb[1]
            while end < n and ids[end] in marks:
                end += 1
            f.end = end
    return groups


def canvas_positions(ids: list[int], visual: list[bool], grids: list[tuple[int, int]], markers: Markers,
                     ) -> tuple[np.ndarray, int]:
    """Positions [3, n] (t, h, w) for one sequence, and the next free 1-D position (for text that follows).

    `grids` is the LLM-token grid (rows, cols) of every visual run in order (thumbnail, then its slices)."""
    n = len(ids)
    if len(visual) != n:
        raise VisionModelError(f"canvas positions: {len(visual)} visual flags for {n} tokens")
    pos = np.zeros((3, n), dtype=np.int64)
    runs = list(visual_runs(visual))
    if len(runs) != len(grids):
        raise VisionModelError(f"canvas positions: {len(runs)} visual runs in the prompt but {len(grids)} crop grids")
    for (a, b), (gh, gw) in zip(runs, grids):
        if b - a != gh * gw:
            raise VisionModelError(f"canvas positions: a visual run of {b - a} tokens at {a} does not fill its "
                                   f"{gh}×{gw} token grid ({gh * gw} tokens)")
    grid_iter = iter(grids)

    def next_grid() -> tuple[int, int]:
        try:
            return next(grid_iter)
        except StopIteration:
            raise VisionModelError("canvas positions: more visual runs in the prompt than crop grids") from None

    def linear(a: int, b: int, start: int) -> int:
        pos[:, a:b] = np.arange(start, start + (b - a))
        return start + (b - a)

    cur, idx = 0, 0
    for group_start, frames in _frames(ids, visual, markers):
        if group_start > idx:
            cur = linear(idx, group_start, cur)
        group_end = frames[-1].end
        cursor = group_start
        for f in frames:
            start = f.thumb[0] - 1  # the frame's `<image>`
            if start > cursor:
                cur = linear(cursor, start, cur) + 1
            end = min(f.end, group_end)
            origin = cur
            th, tw = next_grid()
            grids_s = [next_grid() for _ in f.slices]
            if f.slices:
                cols = len(f.slices)
                for k in range(len(f.slices) - 1):
                    if f.slices[k + 1][0] - f.slices[k][1] > 2:  # more than `</slice><slice>` between: a row ends
                        cols = k + 1
                        break
                rows = len(f.slices) // cols
                if rows * cols != len(f.slices):
                    rows, cols = 1, len(f.slices)
                sh, sw = grids_s[0]
                can_h, can_w = rows * sh, cols * sw
            else:
                rows = cols = sh = sw = 0
                can_h, can_w = th, tw

            pos[:, start:end] = origin
            pos[1:, start] = max(origin - 1, 0)
            if f.thumb[1] < end:
                pos[1, f.thumb[1]] = origin + can_h
                pos[2, f.thumb[1]] = origin + can_w
            a, b = f.thumb
            hh, ww = np.meshgrid(stretch(th, can_h), stretch(tw, can_w), indexing="ij")
            pos[1, a:b] = origin + hh.reshape(-1)
            pos[2, a:b] = origin + ww.reshape(-1)
            for k, ((a, b), (gh, gw)) in enumerate(zip(f.slices, grids_s)):
                h0, w0 = (k // cols) * sh, (k % cols) * sw
                if a - 1 >= start:
                    pos[1, a - 1], pos[2, a - 1] = origin + h0, origin + w0
                if b < end:
                    pos[1, b], pos[2, b] = origin + h0 + gh - 1, origin + w0 + gw - 1
                hh, ww = np.meshgrid(np.arange(gh), np.arange(gw), indexing="ij")
                pos[1, a:b] = origin + h0 + hh.reshape(-1)
                pos[2, a:b] = origin + w0 + ww.reshape(-1)
            for k in range(len(f.slices) - 1):
                gap_a, gap_b = f.slices[k][1], f.slices[k + 1][0]
                if gap_b - gap_a > 2:
                    pos[1, gap_a + 1:gap_b - 1] = origin + (k // cols + 1) * sh - 1
                    pos[2, gap_a + 1:gap_b - 1] = origin + cols * sw
            cur = origin + max(can_h, can_w) + 1
            cursor = end
        if cursor < group_end:
            cur = linear(cursor, group_end, cur)
        idx = group_end
    if idx < n:
        cur = linear(idx, n, cur)
    if next(grid_iter, None) is not None:
        raise VisionModelError("canvas positions: more crop grids than visual runs in the prompt")
    next_pos = int(pos.max()) + 1 if n else 0
    return pos, next_pos


def visual_runs(visual: list[bool]):
    """[start, end) of every maximal run of visual tokens (one run per crop)."""
    i, n = 0, len(visual)
    while i < n:
        if visual[i]:
            j = i
            while j < n and visual[j]:
                j += 1
            yield i, j
            i = j
        else:
            i += 1
