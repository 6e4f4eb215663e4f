"""Video input for MiniCPM-V 4.7: probing, frame sampling exactly as transformers' video processor, and decoding
one frame at a time (PyAV: FFmpeg's libraries in its wheels, no system ffmpeg needed).

What transformers 5.23 does (`MiniCPMV4_6VideoProcessor`, PyAV backend `read_video_pyav`) and we repeat:
metadata from the container (`frames` of the first video stream, `average_rate`, duration = frames / fps),
main frames `int(i * fps)` for each started second, or for clips longer than `max_num_frames` seconds a 0.1 s
grid thinned by `np.linspace` to `max_num_frames`; frames are taken in decode order, each index once, converted
to RGB by FFmpeg's swscale (`to_ndarray(format="rgb24")`). Resizing, slicing and the canvas positions of the
frames happen in the patched runtime (its slicing, canvas and video-frames patches), as for pictures.

Where a container records no frame count (transformers' backend then has no duration and fails), the packets of
the stream are counted instead (demuxing only, nothing decoded).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import numpy as np

from ggufbridge.errors import VisionInputError
from ggufbridge.vision.preprocess import MAX_PIXELS, MAX_SIDE  # frames have the images' bounds

MAX_NUM_FRAMES = 128       # transformers' default max_num_frames (main frames per clip)
MAX_VIDEO_BYTES = 2 << 30  # 2 GiB: the whole file travels to the server in one request
MAX_DURATION_S = 24 * 3600.0  # a day: anything longer is a broken header, not a clip
MAX_FPS = 1000.0


@dataclass(frozen=True)
class VideoInfo:
    width: int
    height: int
    fps: float          # the stream's average frame rate
    total_frames: int   # frames in the stream (the container's count, else counted packets)
    codec: str

    @property
    def duration(self) -> float:
        """transformers' duration: frames / fps."""
        return self.total_frames / self.fps


def _open(src, label: str):
    import av

    try:
        return av.open(src, mode="r")
    except av.error.InvalidDataError:
        raise VisionInputError(f"{label}: not a video in a format FFmpeg can read (invalid data)") from None
    except (av.error.FFmpegError, OSError, ValueError) as e:
        raise VisionInputError(f"{label}: cannot read the video ({e})") from None


def _check_file(path: str | os.PathLike) -> Path:
    p = Path(path)
    if not p.is_file():
        raise VisionInputError(f"{p}: no such video file")
    size = p.stat().st_size
    if size == 0:
        raise VisionInputError(f"{p}: the video file is empty (0 bytes)")
    if size > MAX_VIDEO_BYTES:
        raise VisionInputError(f"{p}: the video file is {size} bytes, more than the limit of {MAX_VIDEO_BYTES}")
    return p


def _info(container, label: str) -> VideoInfo:
    """The stream's facts, checked. May read the container to its end (frame count): open a fresh one to decode."""
    import av

    if not container.streams.video:
        raise VisionInputError(f"{label}: the file has no video stream")
    st = container.streams.video[0]
    cc = st.codec_context
    codec = cc.name if cc is not None else "unknown"
    try:
        av.codec.Codec(codec, "r")
    except Exception:
        raise VisionInputError(f"{label}: video codec {codec!r} cannot be decoded by this FFmpeg build") from None
    w, h = int(st.width or 0), int(st.height or 0)
    if w <= 0 or h <= 0:
        raise VisionInputError(f"{label}: the video stream has no frame size ({w}×{h})")
    if w > MAX_SIDE or h > MAX_SIDE or w * h > MAX_PIXELS:
        raise VisionInputError(f"{label}: frames of {w}×{h} are larger than the limit ({MAX_PIXELS} pixels, "
                               f"{MAX_SIDE} per side)")
    rate = st.average_rate
    fps = float(rate) if rate else 0.0
    if not (0 < fps <= MAX_FPS) or not math.isfinite(fps):
        raise VisionInputError(f"{label}: the video stream has no usable frame rate (found {fps:g}, expected "
                               f"0 < fps <= {MAX_FPS:g})")
    n = int(st.frames or 0)
    if n <= 0:  # no count in the header: count the stream's packets (no decoding; the container is used up)
        try:
            n = sum(1 for pkt in container.demux(st) if pkt.size > 0)
        except av.error.FFmpegError as e:
            raise VisionInputError(f"{label}: the video data is truncated or corrupt ({e})") from None
    if n <= 0:
        raise VisionInputError(f"{label}: the video stream holds no frames")
    info = VideoInfo(w, h, fps, n, codec)
    if info.duration > MAX_DURATION_S:
        raise VisionInputError(f"{label}: the header claims {info.duration:.0f} s ({n} frames at {fps:g} fps), "
                               f"more than the limit of {MAX_DURATION_S:.0f} s")
    return info


@dataclass(frozen=True)
class VideoSettings:
    """The checkpoint's video processor settings that decide a clip's frames (written into the mmproj by convert)."""
    max_num_frames: int = MAX_NUM_FRAMES
    stack_frames: int = 1

    @classmethod
    def of_mmproj(cls, path: str | os.PathLike) -> "VideoSettings":
        """From the mmproj's keys; transformers' defaults for a file converted before they were written."""
        from ggufbridge.ggufio.names import MINICPMV_VIDEO_MAX_NUM_FRAMES, MINICPMV_VIDEO_STACK_FRAMES
        from ggufbridge.ggufio.reader import read_header

        kv = read_header(path).kv
        return cls(int(kv.get(MINICPMV_VIDEO_MAX_NUM_FRAMES, MAX_NUM_FRAMES)),
                   int(kv.get(MINICPMV_VIDEO_STACK_FRAMES, 1)))

    def check(self) -> None:
        """Refuse what the reader cannot do as transformers does: stacked sub-second frames."""
        if self.stack_frames != 1:
            raise VisionInputError(
                f"video: this model's video processor stacks sub-second frames into composites (stack_frames = "
                f"{self.stack_frames}); ggufbridge reads clips with stack_frames = 1 only (transformers' default)")
        if self.max_num_frames < 1:
            raise VisionInputError(f"video: max_num_frames must be >= 1, found {self.max_num_frames}")


def probe(path: str | os.PathLike) -> VideoInfo:
    """Check a video file without decoding it: size, a video stream, a decodable codec, frame size, frame rate,
    duration. Raises VisionInputError with one line saying what is wrong."""
    p = _check_file(path)
    with _open(str(p), str(p)) as c:
        return _info(c, str(p))


def sample_indices(info: VideoInfo, max_num_frames: int = MAX_NUM_FRAMES) -> list[int]:
    """The frame indices transformers' MiniCPM-V video processor samples (`sample_frames`, stack_frames = 1)."""
    if max_num_frames < 1:
        raise VisionInputError(f"max_num_frames must be >= 1, found {max_num_frames}")
    total, fps, duration = info.total_frames, info.fps, info.duration
    if duration > max_num_frames:
        # round(i * 0.1, 1) as transformers writes it: the float grid decides int(ts * fps)
        stamps = [round(i * 0.1, 1) for i in range(int(duration / 0.1))]
        idx = [min(int(ts * fps), total - 1) for ts in stamps]
        if len(idx) > max_num_frames:
            idx = [idx[i] for i in np.linspace(0, len(idx) - 1, max_num_frames, dtype=int)]
        return idx
    return [int(i * fps) for i in range(math.ceil(duration))]


def _sampled(src, indices: list[int], label: str):
    """(index, PyAV frame) for each wanted index, decoding `src` in order and stopping after the last one."""
    import av

    wanted = set(indices)
    last = max(indices) if indices else -1
    with _open(src, label) as c:
        st = c.streams.video[0]
        st.thread_type = "AUTO"
        try:
            for i, frame in enumerate(c.decode(st)):
                if i > last:
                    break
                if i in wanted:
                    yield i, frame
        except av.error.FFmpegError as e:
            raise VisionInputError(f"{label}: the video data is truncated or corrupt ({e})") from None


def iter_frames(src, indices: list[int], label: str = "video") -> Iterator[np.ndarray]:
    """Decode `src` (a path or a binary file object) and yield the frames at `indices` (decode order, each index
    once, as transformers' PyAV reader takes them) as H×W×3 uint8 RGB, one at a time: only the current frame is
    held. Stops after the last wanted index."""
    for _, frame in _sampled(src, indices, label):
        yield frame.to_ndarray(format="rgb24")


def check_decodes(src, info: VideoInfo, indices: list[int], label: str = "video") -> int:
    """Decode `src` up to the last sampled frame (no RGB conversion, nothing kept) and check that every sampled
    frame is there and of the stream's size: a truncated or corrupt clip is refused before any frame is used.
    Returns the number of distinct sampled frames."""
    wanted = {i for i in indices if i < info.total_frames}
    seen = 0
    for i, frame in _sampled(src, sorted(wanted), label):
        if (frame.width, frame.height) != (info.width, info.height):
            raise VisionInputError(f"{label}: frame {i} is {frame.width}×{frame.height} in a stream of "
                                   f"{info.width}×{info.height} (size changes are not supported)")
        seen += 1
    if seen < len(wanted):
        raise VisionInputError(f"{label}: the video data is truncated or corrupt (decoded {seen} of the {len(wanted)} "
                               f"sampled frames; the stream claims {info.total_frames} frames)")
    return seen


@dataclass(frozen=True)
class Sampled:
    info: VideoInfo
    indices: list[int]   # what sample_indices chose (duplicates included, as transformers lists them)

    @property
    def n_frames(self) -> int:
        """Frames the clip contributes: each index once, and only those the stream really has."""
        return len({i for i in self.indices if i < self.info.total_frames})


def load_video(path: str | os.PathLike, max_num_frames: int = MAX_NUM_FRAMES,
               settings: VideoSettings | None = None) -> Sampled:
    """Check a video file and decode it once through (frames are not kept), so that a truncated or corrupt file
    is refused here with a clear message rather than inside the server. `settings` (the model's) are checked
    first and give max_num_frames."""
    if settings is not None:
        settings.check()
        max_num_frames = settings.max_num_frames
    p = _check_file(path)
    info = probe(p)
    idx = sample_indices(info, max_num_frames)
    check_decodes(str(p), info, idx, str(p))
    return Sampled(info, idx)
