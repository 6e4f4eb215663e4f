"""Two `decode_step --logits-out` files of the same inputs side by side (a kernel off, then on): per sequence and
step, the KL divergence of the second's distribution from the first's, whether the top token is the same, and the
largest logit difference. Usage: python3 -m benchmarks.gpu.logits_compare REF.bin TEST.bin [LABEL]
Exit 1 if a file is missing or not such a file or the two differ in shape, 2 on a wrong argument count."""

import sys

import numpy as np


def read(path: str) -> np.ndarray:
    raw = np.fromfile(path, dtype=np.float32)
    n_seq, n_vocab, steps = (int(x) for x in raw[:3].view(np.int32))
    return raw[3:].reshape(steps, n_seq, n_vocab)


def main(ref_path: str, test_path: str, label: str) -> int:
    try:
        ref, test = read(ref_path), read(test_path)
    except (OSError, ValueError) as e:  # missing, or not a --logits-out file (its header does not fit its size)
        print(f"logits_compare: {e}", file=sys.stderr)
        return 1
    if ref.shape != test.shape:
        print(f"logits_compare: shapes differ: {ref.shape} against {test.shape}", file=sys.stderr)
        return 1
    a = ref.reshape(-1, ref.shape[-1]).astype(np.float64)
    b = test.reshape(-1, test.shape[-1]).astype(np.float64)
    la = a - a.max(1, keepdims=True)
    la -= np.log(np.exp(la).sum(1, keepdims=True))
    lb = b - b.max(1, keepdims=True)
    lb -= np.log(np.exp(lb).sum(1, keepdims=True))
    kl = (np.exp(la) * (la - lb)).sum(1)
    top1 = (a.argmax(1) == b.argmax(1)).mean()
    print(f"{label}: {ref.shape[1]} sequences x {ref.shape[0]} steps: KL mean {kl.mean():.3e} max {kl.max():.3e}, "
          f"top-1 same {100 * top1:.1f}%, max |dlogit| {np.abs(a - b).max():.3e}")
    return 0


if __name__ == "__main__":
    if len(sys.argv) not in (3, 4):
        print("usage: python3 -m benchmarks.gpu.logits_compare REF.bin TEST.bin [LABEL]", file=sys.stderr)
        sys.exit(2)
    sys.exit(main(sys.argv[1], sys.argv[2], sys.argv[3] if len(sys.argv) == 4 else "logits"))
