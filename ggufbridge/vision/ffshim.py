"""The video reader llama-server runs for MiniCPM-V 4.7: `ffprobe` and `ffmpeg` programs that speak the subset of
their command lines libmtmd's video helper uses (`--video-ffmpeg-dir`), backed by PyAV and ggufbridge's sampling.

llama-server accepts `video_url` / `input_video` content parts and hands the bytes to mtmd-helper, which asks
`ffprobe` for the frame size and rate, then reads raw RGB frames from `ffmpeg` one at a time (the model-agnostic
upstream design: frames at a fixed rate). Pointing `--video-ffmpeg-dir` at the two programs written here keeps
that server path -- OpenAI API, prompt cache, batched prefill, the draft -- and makes the frames the ones
transformers' MiniCPM-V video processor samples (`video.sample_indices`); the video-frames patch lays them out as the
processor does. The `-vf fps=...` filter the helper asks for is ignored: the sampling is the model's.

Protocol (what mtmd-helper.cpp sends): `ffprobe ... -show_entries stream=width,height,r_frame_rate,nb_frames,
duration ... INPUT` prints `key=value` lines; `ffmpeg ... -i INPUT ... -f rawvideo -pix_fmt rgb24 pipe:1` writes
width*height*3 bytes per frame. INPUT is `pipe:0` / `cache:pipe:0` (the request's bytes on stdin) or a path.
A refused video prints one line on stderr and exits 1; `ffprobe` decodes the sampled frames before it answers,
so that a bad clip fails there: the helper then fails the request, and with the video-load-reason patch
llama-server's 400 carries that line. A model whose video processor stacks frames (`stack_frames` > 1) is refused
the same way.
"""

from __future__ import annotations

import hashlib
import io
import os
import sys
from pathlib import Path

SCRIPT = """#!{python}
# written by ggufbridge (vision/ffshim.py): llama-server's video reader for MiniCPM-V 4.7, not FFmpeg's {name}
import sys
from ggufbridge.vision.ffshim import main
sys.exit(main({name!r}, sys.argv[1:], max_num_frames={max_num_frames}, stack_frames={stack_frames}))
"""


def decoder_dir(cache: Path | None = None, settings=None) -> Path:
    """A folder holding the `ffprobe` and `ffmpeg` programs for `--video-ffmpeg-dir`, bound to this Python (its
    interpreter and ggufbridge) and to the model's video settings (`video.VideoSettings`, default transformers');
    written once per interpreter and settings, atomically."""
    from ggufbridge.files import cache_dir
    from ggufbridge.vision.video import VideoSettings

    st = settings or VideoSettings()
    base = cache or cache_dir()
    texts = {name: SCRIPT.format(python=sys.executable, name=name, max_num_frames=st.max_num_frames,
                                 stack_frames=st.stack_frames) for name in ("ffprobe", "ffmpeg")}
    key = hashlib.sha256("\n".join(texts.values()).encode()).hexdigest()[:12]
    d = base / f"video-reader-{key}"
    for name, text in texts.items():
        f = d / name
        if f.is_file():
            continue
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{name}.{os.getpid()}.tmp"
        tmp.write_text(text)
        tmp.chmod(0o755)
        os.replace(tmp, f)
    return d


def server_args(settings=None) -> list[str]:
    """llama-server options that make `video_url` parts go through this reader (with the model's settings)."""
    return ["--video-ffmpeg-dir", str(decoder_dir(settings=settings))]


def _input(args: list[str]) -> str:
    if "-i" in args:
        return args[args.index("-i") + 1]
    return args[-1]


def _source(inp: str):
    if inp in ("pipe:0", "pipe:", "-", "cache:pipe:0"):
        data = sys.stdin.buffer.read()
        return io.BytesIO(data), f"video ({len(data)} bytes)"
    return inp, f"video {inp}"


def _still_image(src) -> bytes | None:
    """The bytes of `src` when they are a still image by their signature, else None. llama-server hands this
    reader the images stb_image cannot decode: WebP as a single frame, and TIFF (or anything else) as a video. A
    picture is judged as a picture (preprocess: its size from the header, before decoding), so that a WebP or
    TIFF declaring 100000×100000 pixels is refused as an image too large, not as "a video with no frame size"."""
    from ggufbridge.vision.preprocess import image_signature

    if isinstance(src, io.BytesIO):
        data = src.getvalue()
        return data if image_signature(data[:16]) else None
    try:
        with open(src, "rb") as f:
            if image_signature(f.read(16)) is None:
                return None
            f.seek(0)
            return f.read()
    except OSError:
        return None  # the video path reports it


def _serve_still(name: str, data: bytes) -> int:
    """A still image in the protocol: one frame (ffprobe: its size, one frame at 1 fps; ffmpeg: its RGB)."""
    from ggufbridge.vision.preprocess import load_image_bytes

    img = load_image_bytes(data, f"image ({len(data)} bytes)")  # checked from the header, then decoded
    if name == "ffprobe":
        sys.stdout.write(f"width={img.width}\nheight={img.height}\nr_frame_rate=1.0\nnb_frames=1\n"
                         f"duration=1.0\n")
        return 0
    sys.stdout.buffer.write(img.tobytes())
    sys.stdout.buffer.flush()
    return 0


def main(name: str, args: list[str], max_num_frames: int = 128, stack_frames: int = 1) -> int:
    from ggufbridge.errors import VisionInputError
    from ggufbridge.vision import video

    try:
        video.VideoSettings(max_num_frames, stack_frames).check()
        src, label = _source(_input(args))
        if isinstance(src, io.BytesIO) and src.getbuffer().nbytes == 0:
            raise VisionInputError(f"{label}: the video is empty")
        still = _still_image(src)
        if still is not None:
            return _serve_still(name, still)
        with video._open(src, label) as c:
            info = video._info(c, label)
        indices = video.sample_indices(info, max_num_frames)
        if isinstance(src, io.BytesIO):
            src.seek(0)
        if name == "ffprobe":
            # decode the sampled frames once here: a truncated or corrupt clip fails the probe, whose stderr line
            # llama-server (the video-load-reason patch) puts in its answer; a failure while frames stream would end
            # the clip early
            video.check_decodes(src, info, indices, label)
            sys.stdout.write(f"width={info.width}\nheight={info.height}\nr_frame_rate={info.fps!r}\n"
                             f"nb_frames={info.total_frames}\nduration={info.duration!r}\n")
            return 0
        out = sys.stdout.buffer
        for frame in video.iter_frames(src, indices, label):
            if frame.shape != (info.height, info.width, 3):
                raise VisionInputError(f"{label}: a frame of {frame.shape[1]}×{frame.shape[0]} in a stream of "
                                       f"{info.width}×{info.height} (size changes are not supported)")
            out.write(frame.tobytes())
        out.flush()
        return 0
    except VisionInputError as e:
        sys.stderr.write(f"{e}\n")
        return 1
    except BrokenPipeError:  # the helper stopped reading: nothing to report
        return 0
