"""Served vision, exact: `ggufbridge serve` on the patched runtime, through the OpenAI chat API, against
transformers' MiniCPM-V 4.7 (its processor lays out the same chat, its model scores the server's tokens).

Model: SPEC_THW (M-RoPE rotating t, h and w, so a wrong canvas position changes the logits) with the small
vocabulary, so that `top_logprobs` covers the whole distribution and the KL is exact; F32 target and mmproj.
Greedy identity is checked on the same layers with a head refitted to continue every test chat decisively
(random heads give near-ties that any two correct implementations may break differently).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from _runtime_models import serve_process
from _vision_helpers import SPEC_THW, hf_processor, random_image, refit_head, upstream_convention_copy
from ggufbridge.testkit import served_chat as sc
from ggufbridge.convert import convert

pytestmark = pytest.mark.slow
# the CUDA gated-delta-net kernel takes state sizes of 16/32/64/128 only: the same spec serves the CPU and GPU tests
SPEC = dataclasses.replace(SPEC_THW, linear_k_dim=16, linear_v_dim=16)

QUESTION = "What is in the picture?"
CASES = {  # name -> (image sizes (w, h), downsample mode)
    "unsliced": ([(112, 112)], None),
    "1x2": ([(250, 130)], None),
    "2x1": ([(130, 250)], None),
    "2x2-4x": ([(230, 170)], "4x"),
    "two-images": ([(112, 112), (250, 130)], None),
}
CONTINUATION = "A river runs through the valley."
VOCAB = 512


@pytest.fixture(scope="module")
def ban(ckpt):
    """logit_bias that keeps llama-server from sampling byte fragments (see served_chat.partial_utf8_ids)."""
    ck, _ = ckpt
    return {str(i): False for i in sc.partial_utf8_ids(hf_processor(ck).tokenizer)}


def _messages(name: str) -> list[dict]:
    sizes, _ = CASES[name]
    imgs = [random_image(w, h, seed=k + len(name)) for k, (w, h) in enumerate(sizes)]
    return [sc.user_turn(imgs, QUESTION)]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    from ggufbridge.testkit.checkpoint import load_reference, make_minicpmv47

    ck = make_minicpmv47(tmp_path_factory.mktemp("sv-ck"), SPEC, vocab="small")
    return ck, load_reference(ck)


@pytest.fixture(scope="module")
def outs(ckpt, tmp_path_factory):
    """Converted folders: 16x and 4x mmproj (F32), F32 target."""
    ck, _ = ckpt
    return {d: convert(ck, tmp_path_factory.mktemp(f"sv-out-{d}"), outtype="f32", mmproj_outtype="f32",
                       downsample=d, progress=False).out_dir for d in ("16x", "4x")}


class Served:
    """`ggufbridge serve OUT` in a subprocess (the user's command), stopped with SIGTERM."""

    def __init__(self, out_dir: Path, log: Path, *extra: str):
        self.console = log.with_name(log.name + ".console")
        self.srv = serve_process(out_dir, self.console, "--ctx", "4096", "--log", str(log), *extra)
        self.url = self.srv.url

    def close(self) -> str:
        """Stop the server; `ggufbridge serve`'s own output."""
        self.srv.stop(60)
        return self.console.read_text(errors="replace")


@pytest.fixture(scope="module")
def served(outs, tmp_path_factory):
    logs = tmp_path_factory.mktemp("sv-logs")
    s = {d: Served(outs[d], logs / f"{d}.log") for d in outs}
    yield s
    for srv in s.values():
        srv.close()


def _score(ckpt, messages, turn, downsample=None):
    ck, ref = ckpt
    proc = hf_processor(ck, downsample)
    inputs = sc.hf_prompt(proc, messages, downsample)
    ref_lp = sc.hf_scores(ref, inputs, turn.ids, downsample)
    return inputs, ref_lp, sc.kl_to_served(ref_lp, turn.top)


@pytest.mark.parametrize("name", list(CASES))
def test_served_images_match_transformers(ckpt, served, ban, name):
    downsample = CASES[name][1]
    msgs = _messages(name)
    turn = sc.chat(served[downsample or "16x"].url, msgs, max_tokens=8, top_logprobs=VOCAB, logit_bias=ban)
    inputs, ref_lp, kl = _score(ckpt, msgs, turn, downsample)
    assert turn.usage["prompt_tokens"] == inputs["input_ids"].shape[1]  # the same prompt length, image included
    assert len(turn.top[0]) == VOCAB  # the whole distribution: an exact KL
    assert kl.mean() < 1e-3, kl
    allowed = ref_lp.copy()
    allowed[:, [int(i) for i in ban]] = -np.inf
    top2 = np.sort(allowed, 1)[:, -2:]
    clear = top2[:, 1] - top2[:, 0] > 0.05  # a random head has near-ties; greedy identity is the decisive test's
    assert [int(r.argmax()) for r in allowed[clear]] == [t for t, c in zip(turn.ids, clear) if c]


@pytest.mark.gpu
@pytest.mark.parametrize("names", [("1x2", "two-images"), ("2x2-4x",)])
def test_served_images_on_cuda(ckpt, outs, ban, tmp_path, names):
    """The patched runtime built with CUDA, every layer on the GPU (recipe h200): the same chats, KL < 1e-3."""
    downsample = CASES[names[0]][1]
    srv = Served(outs[downsample or "16x"], tmp_path / "cuda.log", "--recipe", "h200")
    try:
        for name in names:
            msgs = _messages(name)
            turn = sc.chat(srv.url, msgs, max_tokens=8, top_logprobs=VOCAB, logit_bias=ban)
            inputs, _, kl = _score(ckpt, msgs, turn, downsample)
            assert turn.usage["prompt_tokens"] == inputs["input_ids"].shape[1]
            assert kl.mean() < 1e-3, (name, kl)
    finally:
        srv.close()


def test_second_turn_reuses_the_cached_image(ckpt, served, ban):
    url = served["16x"].url
    first = _messages("1x2")
    t1 = sc.chat(url, first, max_tokens=6, top_logprobs=VOCAB, logit_bias=ban)
    second = first + [{"role": "assistant", "content": t1.content}, {"role": "user", "content": "And the colours?"}]
    t2 = sc.chat(url, second, max_tokens=6, top_logprobs=VOCAB, logit_bias=ban)
    inputs, _, kl = _score(ckpt, second, t2)
    assert t2.usage["prompt_tokens"] == inputs["input_ids"].shape[1]
    # only the new turn was prefilled: the image and the first answer came from the server's prompt cache
    assert t2.timings["prompt_n"] < inputs["input_ids"].shape[1] // 2, t2.timings
    assert kl.mean() < 1e-3, kl


def test_image_files_under_media_path(ckpt, outs, ban, tmp_path):
    """`serve --media-path DIR` lets clients name images as file:// URLs: the same answer as the data URL."""
    from PIL import Image

    media = tmp_path / "media"
    media.mkdir()
    img = random_image(250, 130, seed=5)
    img.save(media / "river.png")
    srv = Served(outs["16x"], tmp_path / "m.log", "--media-path", str(media))
    try:
        by_file = sc.chat(srv.url, [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "file://river.png"}}, {"type": "text", "text": QUESTION}]}],
            max_tokens=6, top_logprobs=1, logit_bias=ban)
        by_data = sc.chat(srv.url, [sc.user_turn([Image.open(media / "river.png").convert("RGB")], QUESTION)],
                          max_tokens=6, top_logprobs=1, logit_bias=ban)
    finally:
        srv.close()
    assert by_file.ids == by_data.ids and by_file.usage["prompt_tokens"] == by_data.usage["prompt_tokens"]


def test_stock_layout_is_measurably_worse(ckpt, outs, ban, tmp_path):
    """The same chats served the stock way are far from transformers: the patches make the served path exact."""
    srv = Served(sc.stock_layout_copy(outs["16x"], tmp_path / "stock"), tmp_path / "stock.log")
    try:
        for name in ("unsliced", "1x2"):
            msgs = _messages(name)
            turn = sc.chat(srv.url, msgs, max_tokens=8, top_logprobs=VOCAB, logit_bias=ban)
            _, _, kl = _score(ckpt, msgs, turn)
            assert kl.mean() > 1e-2, (name, kl)
    finally:
        out = srv.close()
    # the runtime itself is patched; the file asks for the stock layout, and serve says so in one line
    warnings = [line for line in out.splitlines() if line.startswith("warning: images:")]
    assert len(warnings) == 1 and "without ggufbridge's clip.minicpmv.* keys" in warnings[0], out


def test_upstream_convention_pair_is_served_exactly(ckpt, outs, served, ban, tmp_path):
    """Our mmproj rewritten to upstream llama.cpp's conventions (projector `minicpmv4_7`, `clip.vision.max_slice_nums`,
    none of our `clip.minicpmv.*` keys; tensors untouched) is served as our own file is: the same tokens and
    log-probabilities for every layout, 16x and 4x, and KL < 1e-3 against transformers. The runtime decides by the
    projector type; without the projector-type patch such a file does not load at all."""
    for d in ("16x", "4x"):
        up = upstream_convention_copy(outs[d], tmp_path / f"upstream-{d}")
        srv = Served(up, tmp_path / f"up-{d}.log")
        try:
            for name in [n for n in CASES if (CASES[n][1] or "16x") == d]:
                msgs = _messages(name)
                ours = sc.chat(served[d].url, msgs, max_tokens=8, top_logprobs=VOCAB, logit_bias=ban)
                theirs = sc.chat(srv.url, msgs, max_tokens=8, top_logprobs=VOCAB, logit_bias=ban)
                assert theirs.ids == ours.ids, name
                assert theirs.usage["prompt_tokens"] == ours.usage["prompt_tokens"], name
                assert max(abs(theirs.top[i][t] - lp) for i, row in enumerate(ours.top) for t, lp in row.items()) < 1e-4
                _, _, kl = _score(ckpt, msgs, theirs, CASES[name][1])
                assert kl.mean() < 1e-3, (name, kl)
        finally:
            out = srv.close()
        assert "warning:" not in out  # an exact pair: serve has nothing to warn about


# --- greedy identity with a decisive head, with and without the DSpark draft --------------------------------------

def _decisive(ckpt, tmp_path, names: list[str], boost: float = 30.0) -> Path:
    """A copy of the checkpoint whose head continues every chat in `names` with CONTINUATION decisively: the
    least-squares head update of fixtures.confident, keyed on transformers' hidden states after the image chats."""
    import shutil

    import torch

    ck, ref = ckpt
    out = tmp_path / "decisive-ck"
    shutil.copytree(ck, out)
    cont = _encode(ck, CONTINUATION)
    hs, tg = [], []
    for name in names:
        downsample = CASES[name][1]
        inputs = sc.hf_prompt(hf_processor(ck, downsample), _messages(name), downsample)
        ids = torch.cat([inputs["input_ids"], torch.tensor([cont[:-1]])], 1)
        tt = torch.cat([inputs["mm_token_type_ids"], torch.zeros(1, len(cont) - 1, dtype=torch.long)], 1)
        kw = {"downsample_mode": downsample} if downsample else {}
        with torch.no_grad():
            o = ref(input_ids=ids, pixel_values=inputs["pixel_values"], target_sizes=inputs["target_sizes"],
                    mm_token_type_ids=tt, output_hidden_states=True, **kw)
        n = inputs["input_ids"].shape[1]
        hs.append(o.hidden_states[-1][0, n - 1:])
        tg += cont
    refit_head(out, torch.cat(hs), tg, boost)
    return out


def _encode(ck, text: str) -> list[int]:
    return hf_processor(ck).tokenizer.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("recipe", ["cpu", pytest.param("h200", marks=pytest.mark.gpu)])
def test_greedy_equals_transformers_with_and_without_the_draft(ckpt, tmp_path, recipe):
    from ggufbridge.testkit.dspark import make_dspark

    names = list(CASES)  # every layout, 16x and 4x
    ck = _decisive(ckpt, tmp_path, names)
    draft = make_dspark(tmp_path / "dspark", ck, "tiny")
    outs = {d: convert(ck, tmp_path / f"out-{d}", outtype="f32", mmproj_outtype="f32", draft=draft, downsample=d,
                       progress=False).out_dir for d in ("16x", "4x")}
    want = _encode(ck, CONTINUATION)
    answers = {(): [None] * len(names), ("--draft",): [None] * len(names)}
    for d, out in outs.items():
        for flag in ((), ("--draft",)):
            srv = Served(out, tmp_path / f"s{d}{len(flag)}.log", "--recipe", recipe, *flag)
            try:
                for k, n in enumerate(names):
                    if (CASES[n][1] or "16x") == d:
                        answers[flag][k] = sc.chat(srv.url, _messages(n), max_tokens=len(want), top_logprobs=1)
            finally:
                srv.close()
    for k, name in enumerate(names):
        plain, drafted = answers[()][k], answers[("--draft",)][k]
        assert plain.ids == want, (name, plain.ids, want)  # transformers' decisive continuation, token for token
        assert drafted.ids == plain.ids
        assert drafted.timings.get("draft_n", 0) > 0, drafted.timings  # drafts were made on the image turn
