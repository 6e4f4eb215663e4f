"""Video input against transformers' MiniCPM-V 4.7 video processor (PyAV reader, sample_frames, packing,
slicing, prompt layout, get_rope_index) and model: our reader, the patched libmtmd through the bindings, and
`ggufbridge serve` / `ggufbridge run --video` end to end. Clips are encoded in the test with known content."""

from __future__ import annotations

import base64
import json
import re
import sys
from fractions import Fraction
from functools import partial
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from _video_helpers import hf_processor_with_video, make_clip
from _vision_helpers import SPEC_THW, cosines, flat_prompt, kl_rows, refit_head
from ggufbridge.errors import VisionInputError
from ggufbridge.testkit.served_sweep import video_scores
from ggufbridge.vision import video

# (frames, fps, container, max_num_frames): durations 0.5 … 6.5 s, integer and NTSC rates, the long-clip branch
# (duration > max_num_frames: the 0.1 s grid thinned by linspace), sub-1 fps (repeated indices, taken once)
CLIPS = {
    "4s-10fps": (40, 10, "mp4", 128),
    "2.5s-ntsc": (75, Fraction(30000, 1001), "mp4", 128),
    "0.5s-25fps": (12, 25, "mp4", 128),
    "6.5s-long": (65, 10, "mp4", 4),
    "7s-0.5fps": (4, Fraction(1, 2), "mp4", 128),
    "3.3s-7fps-long": (23, 7, "mp4", 2),
}


def _clip(tmp_path, name, w=64, h=48, codec="mpeg4"):
    n, fps, ext, _ = CLIPS[name]
    return make_clip(tmp_path / f"{name}.{ext}", n, fps, w=w, h=h, codec=codec, seed=n)


@pytest.mark.parametrize("name", list(CLIPS))
def test_frames_match_transformers_reader(tmp_path, name):
    """Our probe, sampling and decoding give transformers' frame indices and its frames, pixel for pixel
    (transformers' own PyAV reader with its MiniCPM-V sample_frames)."""
    from transformers.video_utils import load_video

    clip = _clip(tmp_path, name)
    max_frames = CLIPS[name][3]
    from transformers.models.minicpmv4_6.video_processing_minicpmv4_6 import MiniCPMV4_6VideoProcessor

    ref, meta = load_video(str(clip), backend="pyav",
                           sample_indices_fn=partial(MiniCPMV4_6VideoProcessor().sample_frames,
                                                     max_num_frames=max_frames))
    info = video.probe(clip)
    idx = video.sample_indices(info, max_frames)
    assert idx == list(meta.frames_indices)
    assert (info.fps, info.total_frames) == (meta.fps, meta.total_num_frames)
    ours = np.stack(list(video.iter_frames(str(clip), idx)))
    np.testing.assert_array_equal(ours, ref)
    assert video.load_video(clip, max_frames).n_frames == len(ref)


def test_sampling_is_what_the_pixels_say(tmp_path):
    """Independent of transformers: frame k carries k in its red/green channels, and main frames are the first
    frame of each second (int(i * fps))."""
    clip = make_clip(tmp_path / "c.mp4", 40, 10, codec="libx264", seed=1)
    base = np.stack(list(video.iter_frames(str(clip), list(range(40)))))
    idx = video.sample_indices(video.probe(clip))
    assert idx == [0, 10, 20, 30]
    frames = np.stack(list(video.iter_frames(str(clip), idx)))
    np.testing.assert_array_equal(frames, base[idx])
    assert not np.array_equal(frames, base[[1, 11, 21, 31]])  # the content tells frames apart


def test_container_without_frame_count(tmp_path):
    """Matroska records no frame count (transformers' reader then has no duration): we count packets."""
    mkv = make_clip(tmp_path / "c.mkv", 25, 10, codec="libx264")
    mp4 = make_clip(tmp_path / "c.mp4", 25, 10, codec="libx264")
    a, b = video.probe(mkv), video.probe(mp4)
    assert (a.total_frames, a.fps) == (b.total_frames, b.fps) == (25, 10.0)
    assert video.sample_indices(a) == video.sample_indices(b) == [0, 10, 20]


def _audio_only(path: Path) -> Path:
    """A container with one audio stream and no video (AAC in MP4: llama-server would take a WAV for audio)."""
    import av

    with av.open(str(path), "w") as c:
        st = c.add_stream("aac", rate=8000)
        st.layout = "mono"
        for k in range(4):
            fr = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            fr.sample_rate, fr.pts = 8000, k * 1024
            for pkt in st.encode(fr):
                c.mux(pkt)
        for pkt in st.encode():
            c.mux(pkt)
    return path


def _bad_video(tmp_path: Path, case: str) -> Path:
    """A file a user might send as a video that is not one: see BAD."""
    p = tmp_path / f"{case}.mp4"
    if case == "text":  # a text file renamed .mp4
        p.write_text("These are my holiday notes, not a video.\n" * 20)
    elif case.startswith("truncated"):
        opts = {"movflags": "faststart"} if case.endswith("faststart") else None
        raw = make_clip(tmp_path / "ok.mp4", 60, 10, codec="libx264", options=opts).read_bytes()
        p.write_bytes(raw[: len(raw) // 3])
    elif case == "audio":
        p = _audio_only(tmp_path / "a.mp4")
    return p


BAD = {  # case -> what the one-line reason says
    "text": "not a video",
    "truncated-mp4": "not a video",  # the index (moov) is at the end: the header is gone
    "truncated-faststart": "truncated or corrupt",  # the index first, then a third of the data
    "audio": "no video stream",
}


@pytest.mark.parametrize("case, match", [
    ("missing", "no such video file"),
    ("empty", "empty"),
    ("garbage", "not a video|cannot read"),
    *[(c, BAD[c]) for c in ("truncated-mp4", "truncated-faststart", "audio")],
    ("huge", "larger than the limit"),
    ("long", "more than the limit"),
])
def test_bad_videos(tmp_path, monkeypatch, case, match):
    p = tmp_path / "v.mp4"
    if case == "empty":
        p.write_bytes(b"")
    elif case == "garbage":
        p.write_bytes(b"\x00\x01not a video" * 100)
    elif case.startswith("truncated") or case == "audio":
        p = _bad_video(tmp_path, case)
    elif case == "huge":
        make_clip(p, 5, 5)
        monkeypatch.setattr(video, "MAX_PIXELS", 64 * 47)
    elif case == "long":
        make_clip(p, 5, 5)
        monkeypatch.setattr(video, "MAX_DURATION_S", 0.5)
    with pytest.raises(VisionInputError, match=match) as e:
        video.load_video(p)
    assert "\n" not in str(e.value)


def test_reader_programs_speak_the_helpers_protocol(tmp_path):
    """What libmtmd's video helper runs: `ffprobe ... pipe:0` (key=value lines) and `ffmpeg ... -i cache:pipe:0 ...
    pipe:1` (raw rgb24 frames), both fed the request's bytes on stdin; a bad video exits 1 with one line."""
    import subprocess

    clip = make_clip(tmp_path / "c.mp4", 40, 10, w=64, h=48)
    d = __import__("ggufbridge.vision.ffshim", fromlist=["x"]).decoder_dir(tmp_path / "cache")
    raw = clip.read_bytes()
    probe = subprocess.run([str(d / "ffprobe"), "-v", "quiet", "-show_entries",
                            "stream=width,height,r_frame_rate,nb_frames,duration", "-select_streams", "v:0", "-of",
                            "default=noprint_wrappers=1", "pipe:0"], input=raw, capture_output=True, check=True)
    kv = dict(line.split("=", 1) for line in probe.stdout.decode().split())
    assert (kv["width"], kv["height"], float(kv["r_frame_rate"])) == ("64", "48", 10.0)
    out = subprocess.run([str(d / "ffmpeg"), "-nostdin", "-read_ahead_limit", "-1", "-i", "cache:pipe:0", "-vf",
                          "fps=4.000000", "-f", "rawvideo", "-pix_fmt", "rgb24", "pipe:1", "-loglevel", "error"],
                         input=raw, capture_output=True, check=True).stdout
    frames = np.frombuffer(out, np.uint8).reshape(-1, 48, 64, 3)
    np.testing.assert_array_equal(frames, np.stack(list(video.iter_frames(str(clip), [0, 10, 20, 30]))))
    bad = subprocess.run([str(d / "ffmpeg"), "-i", "cache:pipe:0", "pipe:1"], input=b"junk" * 10, capture_output=True)
    assert bad.returncode == 1 and bad.stderr.decode().count("\n") == 1


@pytest.mark.parametrize("case", list(BAD))
def test_reader_probe_refuses_bad_videos_in_one_line(tmp_path, case):
    """What llama-server's 400 carries (patch mtmd-helper-video-load-reason): `ffprobe` on the request's bytes
    exits 1 with one line saying what is wrong, before any frame is streamed -- a clip truncated after its index
    included (its header probes fine; the probe decodes the sampled frames)."""
    import subprocess

    from ggufbridge.vision import ffshim

    d = ffshim.decoder_dir(tmp_path / "cache")
    r = subprocess.run([str(d / "ffprobe"), "-v", "quiet", "pipe:0"], input=_bad_video(tmp_path, case).read_bytes(),
                       capture_output=True)
    err = r.stderr.decode()
    assert (r.returncode, r.stdout, err.count("\n")) == (1, b"", 1), (r.returncode, r.stdout, err)
    assert re.match(r"video \(\d+ bytes\): ", err) and BAD[case] in err, err


def test_reader_samples_with_the_models_settings(tmp_path):
    """The programs carry the model's video settings: max_num_frames = 2 gives transformers' frames for 2 (the
    long-clip branch); stack_frames = 3 is refused in one line (composites are not implemented)."""
    import subprocess
    from transformers.video_utils import load_video

    from transformers.models.minicpmv4_6.video_processing_minicpmv4_6 import MiniCPMV4_6VideoProcessor
    from ggufbridge.vision import ffshim

    clip = make_clip(tmp_path / "c.mp4", 40, 10, w=64, h=48)
    ref, _ = load_video(str(clip), backend="pyav", sample_indices_fn=partial(MiniCPMV4_6VideoProcessor().sample_frames,
                                                                              max_num_frames=2))
    d = ffshim.decoder_dir(tmp_path / "cache", video.VideoSettings(max_num_frames=2))
    out = subprocess.run([str(d / "ffmpeg"), "-i", str(clip), "-f", "rawvideo", "pipe:1"], capture_output=True,
                         check=True).stdout
    np.testing.assert_array_equal(np.frombuffer(out, np.uint8).reshape(-1, 48, 64, 3), ref)
    assert len(ref) == 2
    d = ffshim.decoder_dir(tmp_path / "cache", video.VideoSettings(stack_frames=3))
    r = subprocess.run([str(d / "ffprobe"), "pipe:0"], input=clip.read_bytes(), capture_output=True)
    assert r.returncode == 1 and r.stderr.decode().count("\n") == 1 and "stack_frames = 3" in r.stderr.decode()


@pytest.mark.parametrize("where", ["processor_config", "video_preprocessor_config", "preprocessor_config", "none"])
def test_video_settings_are_read_where_transformers_reads_them(tmp_path, where):
    """convert reads max_num_frames / stack_frames from the file transformers' video processor loads (its own
    lookup, get_video_processor_dict, is the reference) and writes them into the mmproj."""
    from transformers.models.minicpmv4_6.video_processing_minicpmv4_6 import MiniCPMV4_6VideoProcessor

    from ggufbridge.arch.minicpmv4_7_vision import read_video_settings
    from ggufbridge.checkpoint.model_dir import ModelDir
    from ggufbridge.convert import convert
    from ggufbridge.testkit.checkpoint import make_minicpmv47

    ck = make_minicpmv47(tmp_path / "ck", "tiny", vocab="small")
    pre = json.loads((ck / "preprocessor_config.json").read_text())
    vp = {**pre, "max_num_frames": 7, "stack_frames": 3}
    decoy = {**pre, "max_num_frames": 5, "stack_frames": 2}  # shadowed by the file before it in the lookup
    if where == "processor_config":
        (ck / "processor_config.json").write_text(json.dumps({"video_processor": vp}))
        (ck / "video_preprocessor_config.json").write_text(json.dumps(decoy))
    elif where == "video_preprocessor_config":
        (ck / "video_preprocessor_config.json").write_text(json.dumps(vp))
        (ck / "preprocessor_config.json").write_text(json.dumps(decoy))
    elif where == "preprocessor_config":
        (ck / "preprocessor_config.json").write_text(json.dumps(vp))
    upstream = MiniCPMV4_6VideoProcessor.get_video_processor_dict(str(ck))[0]
    hf = {"max_num_frames": 128, "stack_frames": 1,
          **{k: v for k, v in upstream.items() if k in ("max_num_frames", "stack_frames")}}
    assert read_video_settings(ModelDir.open(ck)) == hf
    out = convert(ck, tmp_path / "out", outtype="f32", mmproj_outtype="f32", progress=False)
    got = video.VideoSettings.of_mmproj(out.path("mmproj"))
    assert (got.max_num_frames, got.stack_frames) == (hf["max_num_frames"], hf["stack_frames"])


# --- the patched runtime (slow): layout, positions, embeddings and logits against transformers -------------------

QUESTION = "What happens in the clip?"


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """SPEC_THW (M-RoPE rotating t, h and w) with the small vocabulary, converted F32 (16x and 4x mmproj)."""
    import dataclasses

    from ggufbridge.convert import convert
    from ggufbridge.testkit.checkpoint import load_reference, make_minicpmv47

    from ggufbridge.testkit.dspark import make_dspark

    spec = dataclasses.replace(SPEC_THW, linear_k_dim=16, linear_v_dim=16)
    ck = make_minicpmv47(tmp_path_factory.mktemp("vid-ck"), spec, vocab="small")
    draft = make_dspark(tmp_path_factory.mktemp("vid-dspark") / "dspark", ck, "tiny")
    outs = {d: convert(ck, tmp_path_factory.mktemp(f"vid-out-{d}"), outtype="f32", mmproj_outtype="f32",
                       downsample=d, draft=draft if d == "16x" else None, progress=False) for d in ("16x", "4x")}
    ref = load_reference(ck)
    # the fixture's tokenizer names <unk> for pictures and clips; its config leaves video_token_id unset, and
    # transformers then never scatters the video features in
    ref.config.video_token_id = ref.model.config.video_token_id = ref.config.image_token_id
    return ck, outs, ref


def _chat(placeholder: str, question: str = QUESTION) -> str:
    return ("<|im_start|>user\n" + placeholder + question + "<|im_end|>\n<|im_start|>assistant\n"
            "<think>\n\n</think>\n\n")


def _hf(ck, ref, clip, question=QUESTION, downsample=None, logits=True):
    """transformers' processor output (the video from the file, through its PyAV reader), get_rope_index's
    positions [3, n], and (with `logits`) the model's logits for the prompt."""
    import torch

    proc = hf_processor_with_video(ck, downsample)
    want = proc(text=[_chat("<unk>", question)], videos=[str(clip)], return_tensors="pt")
    kw = {"downsample_mode": downsample} if downsample else {}
    rope, _ = ref.model.get_rope_index(want["input_ids"], mm_token_type_ids=want["mm_token_type_ids"],
                                       target_sizes_videos=want["target_sizes_videos"], **kw)
    out = None
    if logits:
        with torch.no_grad():
            out = ref(input_ids=want["input_ids"], pixel_values_videos=want["pixel_values_videos"],
                      target_sizes_videos=want["target_sizes_videos"], mm_token_type_ids=want["mm_token_type_ids"],
                      **kw).logits[0].float().numpy()
    return want, rope[:, 0].numpy(), out


def _runtime_chunks(res, clip, question=QUESTION, encode=False):
    from ggufbridge.testkit.bindings import VisionSession

    info = video.probe(clip)
    frames = list(video.iter_frames(str(clip), video.sample_indices(info)))
    with VisionSession(res.path("target"), res.path("mmproj"), n_ctx=4096) as s:
        chunks = s.chunks(_chat(s.marker * len(frames), question), frames, encode=encode, frames=True)
        ev = s.eval(chunks) if encode else None
    return chunks, ev


LAYOUTS = {  # clip -> (frames, fps, w, h, downsample): unsliced, 1×2 and 2×1 slices, 2×2 in 4x, NTSC
    "unsliced": (20, 10, 112, 112, None),
    "1x2": (25, 10, 250, 130, None),
    "2x1-ntsc": (75, Fraction(30000, 1001), 130, 250, None),
    "2x2-4x": (30, 10, 230, 170, "4x"),
}


@pytest.mark.slow
@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_and_positions_match_transformers(model, tmp_path, name):
    """The patched libmtmd lays a clip out as the processor does -- every frame "<image>…</image>" plus slices,
    no <image_id>, the same token ids around the frames -- with get_rope_index's positions for the frame group."""
    ck, outs, ref = model
    n, fps, w, h, ds = LAYOUTS[name]
    clip = make_clip(tmp_path / "c.mp4", n, fps, w=w, h=h, seed=n)
    want, rope, _ = _hf(ck, ref, clip, downsample=ds, logits=False)
    chunks, _ = _runtime_chunks(outs[ds or "16x"], clip)
    ids, pos = flat_prompt(chunks)
    hf_ids = np.array(want["input_ids"][0].tolist())
    in_chunk = np.array(ids) < 0
    assert len(ids) == len(hf_ids)
    np.testing.assert_array_equal(np.array(ids)[~in_chunk], hf_ids[~in_chunk])  # the text around the frames
    tok = hf_processor_with_video(ck).tokenizer
    frame_vocab = {tok.convert_tokens_to_ids(t) for t in ("<unk>", "<image>", "</image>", "<slice>", "</slice>")}
    frame_vocab |= set(tok.encode("\n"))
    assert set(hf_ids[in_chunk].tolist()) <= frame_vocab  # the frame chunks hold exactly the frames' tokens
    np.testing.assert_array_equal(pos, rope)  # canvas M-RoPE of every frame, markers included


@pytest.mark.slow
def test_without_the_patch_frames_get_image_ids(model, tmp_path):
    """The ablation: the same frames passed as pictures (not marked as a clip's frames) get <image_id>N</image_id>
    each, which the processor never puts in a video prompt: the layout no longer matches."""
    from ggufbridge.testkit.bindings import VisionSession

    ck, outs, ref = model
    clip = make_clip(tmp_path / "c.mp4", 20, 10, w=112, h=112)
    want, _, _ = _hf(ck, ref, clip, logits=False)
    frames = list(video.iter_frames(str(clip), video.sample_indices(video.probe(clip))))
    with VisionSession(outs["16x"].path("target"), outs["16x"].path("mmproj"), n_ctx=4096) as s:
        ids, _ = flat_prompt(s.chunks(_chat(s.marker * len(frames)), frames, encode=False))
    assert len(ids) > want["input_ids"].shape[1]


@pytest.mark.slow
def test_frame_embeddings_and_logits_match_transformers(model, tmp_path):
    """The frames' visual rows equal transformers' get_video_features (cosine > 0.9999 per token: the crops are
    resized with torch's CPU uint8 kernel on both sides, the rest is the towers' float noise), and the prompt's
    logits KL < 1e-3."""
    import torch

    ck, outs, ref = model
    clip = make_clip(tmp_path / "c.mp4", 25, 10, w=250, h=130, seed=3)
    want, rope, hf_logits = _hf(ck, ref, clip)
    chunks, ev = _runtime_chunks(outs["16x"], clip, encode=True)
    ids, pos = flat_prompt(chunks)
    np.testing.assert_array_equal(pos, rope)
    with torch.no_grad():
        feats = ref.model.get_video_features(want["pixel_values_videos"], want["target_sizes_videos"])
    hf_rows = torch.cat(list(feats.pooler_output)).float().numpy()
    in_chunk = np.array(ids) < 0
    visual = want["mm_token_type_ids"][0].numpy() == 2
    assert not visual[~in_chunk].any()
    rows = np.concatenate([c.embd for c in chunks if c.kind == "image"])[visual[in_chunk]]  # the crops' rows
    assert rows.shape == hf_rows.shape
    assert cosines(rows, hf_rows).min() > 0.9999
    k = kl_rows(hf_logits, ev.logits)
    assert k.mean() < 1e-3, k.mean()


# --- `ggufbridge serve` (OpenAI API, video_url) and `ggufbridge run --video`, end to end (slow) ----------------------

VOCAB = 512  # the small vocabulary: top_logprobs = the whole distribution, an exact KL


def _video_turn(clip: Path, question: str = QUESTION) -> dict:
    url = "data:video/mp4;base64," + base64.b64encode(clip.read_bytes()).decode()
    return {"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}},
                                        {"type": "text", "text": question}]}


@pytest.fixture(scope="module")
def served_video(model, tmp_path_factory):
    """`ggufbridge serve OUT` and `ggufbridge serve OUT --draft` (the user's commands) on the 16x folder."""
    from _runtime_models import serve_process

    _, outs, _ = model
    logs = tmp_path_factory.mktemp("vid-logs")
    srvs = {flag: serve_process(outs["16x"].out_dir, logs / f"console{len(flag)}", "--ctx", "4096", "--log",
                                str(logs / f"server{len(flag)}.log"), *flag) for flag in ((), ("--draft",))}
    yield srvs
    for s in srvs.values():
        s.stop(60)


@pytest.fixture(scope="module")
def ban(model):
    from ggufbridge.testkit import served_chat as sc

    return {str(i): False for i in sc.partial_utf8_ids(hf_processor_with_video(model[0]).tokenizer)}


@pytest.mark.slow
@pytest.mark.parametrize("draft", [False, True], ids=["plain", "draft"])
def test_served_video_matches_transformers(model, served_video, ban, tmp_path, draft):
    """A clip sent as an OpenAI `video_url` part to `ggufbridge serve` (with and without --draft): the same prompt
    length as transformers' processor, and teacher-forced KL < 1e-3 on the generated tokens."""
    from ggufbridge.testkit import served_chat as sc

    ck, _, ref = model
    clip = make_clip(tmp_path / "c.mp4", 32, Fraction(30000, 1001), w=250, h=130, codec="libx264", seed=7)
    srv = served_video[("--draft",) if draft else ()]
    turn = sc.chat(srv.url, [_video_turn(clip)], max_tokens=8, top_logprobs=VOCAB, logit_bias=ban)
    want, _, _ = _hf(ck, ref, clip, logits=False)
    assert turn.usage["prompt_tokens"] == want["input_ids"].shape[1]
    assert len(turn.top[0]) == VOCAB
    kl = sc.kl_to_served(video_scores(ref, want, turn.ids), turn.top)
    assert kl.mean() < 1e-3, kl
    if draft:
        assert turn.timings.get("draft_n", 0) > 0, turn.timings  # the draft ran on the video turn


@pytest.mark.slow
@pytest.mark.parametrize("case", ["empty", *BAD])
def test_served_bad_video_says_why(served_video, tmp_path, case):
    """A bad `video_url` part sent with the OpenAI client to `ggufbridge serve`: 400, and the message says what is
    wrong with the video (the reader's line, carried by patch mtmd-helper-video-load-reason), not only that
    something failed to load."""
    import openai

    raw = b"" if case == "empty" else _bad_video(tmp_path, case).read_bytes()
    client = openai.OpenAI(base_url=served_video[()].url + "/v1", api_key="none", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="m", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "video_url", "video_url": {"url": "data:video/mp4;base64," + base64.b64encode(raw).decode()}},
            {"type": "text", "text": "?"}]}])
    assert e.value.status_code == 400
    msg = e.value.body["message"] if isinstance(e.value.body, dict) else str(e.value)
    if case == "empty":  # refused by llama-server itself before any reader runs
        assert re.search("empty|base64|load", msg, re.I), msg
    else:
        assert re.search(rf"video \(\d+ bytes\): .*{BAD[case]}", msg), msg


@pytest.mark.slow
def test_stacked_frames_are_refused(tmp_path):
    """A checkpoint whose video processor stacks sub-second frames (stack_frames = 3, not implemented): it converts
    (pictures are unaffected), and `run --video` refuses the clip in one line, exit 2, before any server starts."""
    from ggufbridge.cli import cli as main
    from ggufbridge.convert import convert
    from ggufbridge.testkit.checkpoint import make_minicpmv47

    ck = make_minicpmv47(tmp_path / "ck", "tiny", vocab="small")
    pre = json.loads((ck / "preprocessor_config.json").read_text())
    (ck / "processor_config.json").write_text(json.dumps({"video_processor": {**pre, "stack_frames": 3}}))
    out = convert(ck, tmp_path / "out", outtype="f32", mmproj_outtype="f32", progress=False).out_dir
    clip = make_clip(tmp_path / "c.mp4", 20, 10)
    r = CliRunner().invoke(main, ["run", str(out), "--video", str(clip), "-p", "?"])
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1 and "stack_frames = 3" in r.output, r.output


@pytest.mark.slow
def test_run_video_answers_as_the_server_does(model, served_video, tmp_path):
    """`ggufbridge run OUT --video clip -p …` (a private llama-server) prints the answer the served chat gives."""
    from ggufbridge.cli import cli as main
    from ggufbridge.runtime import server as sv

    _, outs, _ = model
    clip = make_clip(tmp_path / "c.mp4", 20, 10, w=112, h=112, seed=9)
    r = CliRunner().invoke(main, ["run", str(outs["16x"].out_dir), "--video", str(clip), "-p", QUESTION, "-n", "6",
                                  "--no-think"])
    assert r.exit_code == 0, r.output
    status, body = sv.http_json(served_video[()].url + "/v1/chat/completions", {
        "messages": [_video_turn(clip)], "max_tokens": 6, "temperature": 0, "seed": 0,
        "chat_template_kwargs": {"enable_thinking": False}})
    assert status == 200
    assert r.output.rstrip("\n") == body["choices"][0]["message"]["content"]


# --- `ggufbridge run --video`, greedy, against transformers' generate (slow) ----------------------------------------

CONTINUATION = "A river runs through the valley."
SHIFTED = "Two cats sleep on a warm mat."  # what the head says when the frames are one later


def _shifted_sampler(proc):
    """transformers' processor whose sampler takes each frame one later (int(i * fps) + 1): the wrong frames."""
    vp = proc.video_processor
    orig = vp.sample_frames
    vp.sample_frames = lambda metadata, **kw: [min(i + 1, metadata.total_num_frames - 1) for i in orig(metadata, **kw)]
    return proc


def _decisive_video(ck, ref, clip: Path, out: Path, boost: float = 30.0) -> Path:
    """A copy of the checkpoint whose head continues the clip's chat with CONTINUATION and the same chat read
    with each frame one later with SHIFTED, decisively: the least-squares head update of test_served_vision's
    _decisive, keyed on transformers' hidden states (its processor, its PyAV reader, its model)."""
    import shutil

    import torch

    shutil.copytree(ck, out)
    tok = hf_processor_with_video(ck).tokenizer
    hs, tg = [], []
    for proc, text in ((hf_processor_with_video(ck), CONTINUATION),
                       (_shifted_sampler(hf_processor_with_video(ck)), SHIFTED)):
        cont = tok.encode(text, add_special_tokens=False)
        want = proc(text=[_chat("<unk>")], videos=[str(clip)], return_tensors="pt")
        n = want["input_ids"].shape[1]
        ids = torch.cat([want["input_ids"], torch.tensor([cont[:-1]])], 1)
        tt = torch.cat([want["mm_token_type_ids"], torch.zeros(1, len(cont) - 1, dtype=torch.long)], 1)
        with torch.no_grad():
            o = ref(input_ids=ids, mm_token_type_ids=tt, pixel_values_videos=want["pixel_values_videos"],
                    target_sizes_videos=want["target_sizes_videos"], output_hidden_states=True)
        hs.append(o.hidden_states[-1][0, n - 1:])
        tg += cont
    refit_head(out, torch.cat(hs), tg, boost)
    return out


def _hf_greedy(ck, clip: Path, n: int) -> list[int]:
    """transformers' greedy continuation (generate, do_sample=False) of the clip's chat."""
    import torch

    from ggufbridge.testkit.checkpoint import load_reference

    ref = load_reference(ck)
    ref.config.video_token_id = ref.model.config.video_token_id = ref.config.image_token_id  # as in `model`
    want = hf_processor_with_video(ck)(text=[_chat("<unk>")], videos=[str(clip)], return_tensors="pt")
    with torch.no_grad():
        out = ref.generate(input_ids=want["input_ids"], attention_mask=want["attention_mask"],
                           mm_token_type_ids=want["mm_token_type_ids"], pixel_values_videos=want["pixel_values_videos"],
                           target_sizes_videos=want["target_sizes_videos"], max_new_tokens=n, do_sample=False)
    return out[0, want["input_ids"].shape[1]:].tolist()


def _reader_dir(tmp_path: Path, shift: bool) -> Path:
    """`--video-ffmpeg-dir` programs: ours, or (the ablation) ours with each sampled frame one later."""
    from ggufbridge.vision import ffshim

    if not shift:
        return ffshim.decoder_dir(tmp_path / "cache")
    d = tmp_path / "shifted-reader"
    d.mkdir(exist_ok=True)
    for name in ("ffprobe", "ffmpeg"):
        (d / name).write_text(
            f"#!{sys.executable}\nimport sys\nfrom ggufbridge.vision import ffshim, video\n"
            "orig = video.sample_indices\n"
            "video.sample_indices = lambda info, *a: [min(i + 1, info.total_frames - 1) for i in orig(info, *a)]\n"
            f"sys.exit(ffshim.main({name!r}, sys.argv[1:]))\n")
        (d / name).chmod(0o755)
    return d


@pytest.mark.slow
def test_run_video_greedy_equals_transformers_generate(model, tmp_path, monkeypatch):
    """`ggufbridge run OUT --video clip -p …` through click (its private llama-server, our reader, the patched
    libmtmd) prints transformers' greedy continuation of the same clip and prompt (generate with its processor and
    PyAV reader), on a head that answers this clip decisively. The ablation: the same run with a reader that
    samples each frame one later prints the other continuation, not transformers'."""
    from ggufbridge.cli import cli as main
    from ggufbridge.convert import convert
    from ggufbridge.vision import ffshim

    ck, _, ref = model
    clip = make_clip(tmp_path / "c.mp4", 30, 10, w=112, h=112, seed=11)  # frames 0, 10, 20 (ablation: 1, 11, 21)
    dck = _decisive_video(ck, ref, clip, tmp_path / "decisive-ck")
    tok = hf_processor_with_video(ck).tokenizer
    cont = tok.encode(CONTINUATION, add_special_tokens=False)
    want = _hf_greedy(dck, clip, len(cont))
    assert want == cont  # transformers itself continues the clip decisively
    out = convert(dck, tmp_path / "out", outtype="f32", mmproj_outtype="f32", progress=False).out_dir
    answers = {}
    for shift in (False, True):
        monkeypatch.setattr(ffshim, "server_args",
                            lambda settings=None, s=shift: ["--video-ffmpeg-dir", str(_reader_dir(tmp_path, s))])
        r = CliRunner().invoke(main, ["run", str(out), "--video", str(clip), "-p", QUESTION, "-n", str(len(cont)),
                                      "--no-think"])
        assert r.exit_code == 0, r.output
        answers[shift] = r.output.rstrip("\n")
    assert answers[False] == tok.decode(want)  # token for token what transformers generates
    assert answers[True] == SHIFTED and answers[True] != tok.decode(want)  # wrong frames: another answer


@pytest.mark.slow
@pytest.mark.parametrize("case, match", [("missing", "no such video file"), ("empty", "empty"),
                                         ("garbage", "not a video")])
def test_run_bad_video_exits_2(model, tmp_path, case, match):
    from ggufbridge.cli import cli as main

    _, outs, _ = model
    p = tmp_path / "v.mp4"
    if case == "empty":
        p.write_bytes(b"")
    elif case == "garbage":
        p.write_bytes(b"\x00junk" * 64)
    r = CliRunner().invoke(main, ["run", str(outs["16x"].out_dir), "--video", str(p), "-p", "?"])
    assert r.exit_code == 2, r.output
    assert len(r.output.strip().splitlines()) == 1 and "Traceback" not in r.output
    assert __import__("re").search(match, r.output), r.output
