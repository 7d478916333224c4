#!/usr/bin/env python3
"""PyTorch reference of vramq's reference embedding model (model/refembed/embed.go).

Reads the model's weights and a token batch, both safetensors files written
by Go (refembed.WriteWeights, cmd/genweights; refembed.WriteTokenBatch, in
model/refembed/handoff_test.go), and

  --out PATH    writes the embeddings of every item of the batch, F32
                "embeddings" [N, Out], for Go to compare (refembed.LoadEmbeddings);
  --bench LIST  times batches of the first B items for each B in LIST and
                prints one JSON line per batch size with items/s.

The model, as model/refembed/embed.go documents it:

  x   = mean of the item's token embeddings      (embedding_bag, mode="mean")
  y   = GELU_tanh(x @ w1 + b1) @ w2 + b2
  out = y / ||y||

Needs Python 3 and PyTorch only: the safetensors files are parsed here with
json and struct (no safetensors or numpy package). The file functions do not
import torch, so the Go tests exercise them with a plain python3.

  python3 bench/torch/embed.py --weights build/model.safetensors \\
      --batch build/batch.safetensors --bench 8,64,512 --out build/torch.safetensors
"""

import argparse
import json
import struct
import sys
import time

MAX_HEADER = 100_000_000  # the safetensors reference reader's limit
# I64: Hugging Face BERT checkpoints carry the buffer embeddings.position_ids as I64.
DTYPE_SIZE = {"F32": 4, "F16": 2, "BF16": 2, "I32": 4, "I64": 8}
WEIGHTS_FORMAT = "vramq-ref-embed-v1"
BATCH_FORMAT = "vramq-token-batch-v1"
EMBEDDINGS_FORMAT = "vramq-embeddings-v1"


def read_safetensors(path):
    """Returns (metadata, {name: (dtype, shape, bytes)}) of a safetensors file.

    Checks what the computation relies on: the header within the file, each
    tensor's byte length against its shape and dtype, its bytes within the
    buffer. The Go reader that wrote the inputs is the strict one.
    """
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack_from("<Q", data, 0)
    if n > MAX_HEADER or 8 + n > len(data):
        raise ValueError(f"{path}: header length {n} is invalid for a file of {len(data)} bytes")
    header = json.loads(data[8 : 8 + n].decode("utf-8"))
    metadata = header.pop("__metadata__", None) or {}
    buf = memoryview(data)[8 + n :]
    tensors = {}
    for name, info in header.items():
        dtype, shape, (begin, end) = info["dtype"], info["shape"], info["data_offsets"]
        if dtype not in DTYPE_SIZE:
            raise ValueError(f"{path}: tensor {name!r} is {dtype}, want one of {sorted(DTYPE_SIZE)}")
        count = 1
        for d in shape:
            count *= d
        if not 0 <= begin <= end <= len(buf) or end - begin != count * DTYPE_SIZE[dtype]:
            raise ValueError(f"{path}: tensor {name!r}: shape {shape} of {dtype} does not fit data_offsets {[begin, end]}")
        tensors[name] = (dtype, list(shape), bytes(buf[begin:end]))
    return metadata, tensors


def write_safetensors(path, tensors, metadata):
    """Writes [(name, dtype, shape, bytes)] and metadata as a safetensors file,
    the header padded with spaces to a multiple of 8 bytes as the format's
    reference writer pads it."""
    header = {"__metadata__": metadata}
    offset = 0
    for name, dtype, shape, raw in tensors:
        header[name] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset, offset + len(raw)]}
        offset += len(raw)
    text = json.dumps(header).encode("utf-8")
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)))
        f.write(text)
        for _, _, _, raw in tensors:
            f.write(raw)


def check_format(path, metadata, want):
    if metadata.get("format") != want:
        raise ValueError(f"{path}: metadata format is {metadata.get('format')!r}, want {want!r}")


def to_tensor(torch, dtype, shape, raw):
    """A CPU tensor of the little-endian bytes raw (this runs on x86 and ARM,
    both little-endian), in memory of its own."""
    torch_dtype = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16, "I32": torch.int32, "I64": torch.int64}[dtype]
    if not raw:
        return torch.empty(shape, dtype=torch_dtype)
    return torch.frombuffer(bytearray(raw), dtype=torch_dtype).reshape(shape)


def load_weights(torch, path, device):
    metadata, tensors = read_safetensors(path)
    check_format(path, metadata, WEIGHTS_FORMAT)
    names = ["embedding", "w1", "b1", "w2", "b2"]
    if sorted(tensors) != sorted(names):
        raise ValueError(f"{path}: tensors {sorted(tensors)}, want {names}")
    # F16 and BF16 widen to float32 exactly, as the Go loader widens them.
    return {name: to_tensor(torch, *tensors[name]).float().to(device) for name in names}


def load_batch(torch, path):
    metadata, tensors = read_safetensors(path)
    check_format(path, metadata, BATCH_FORMAT)
    tokens = to_tensor(torch, *tensors["tokens"])
    offsets = to_tensor(torch, *tensors["offsets"])
    return tokens, offsets, int(metadata["vocab"])


def forward(torch, w, tokens, starts):
    """The model on one batch: tokens [T] and starts [N] (each item's first
    token), int64, on w's device."""
    f = torch.nn.functional
    x = f.embedding_bag(tokens, w["embedding"], starts, mode="mean")
    h = f.gelu(torch.addmm(w["b1"], x, w["w1"]), approximate="tanh")
    y = torch.addmm(w["b2"], h, w["w2"])
    return f.normalize(y, dim=1)


def step(torch, w, tokens, offsets, device):
    """One batch as the Go backends run one: int32 ids and offsets from the
    host, embeddings back on the host."""
    t = tokens.to(device).long()
    s = offsets[:-1].to(device).long()
    return forward(torch, w, t, s).cpu()


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--weights", required=True, help="weights file (cmd/genweights, refembed.WriteWeights)")
    p.add_argument("--batch", required=True, help="token batch file (refembed.WriteTokenBatch)")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--out", help="write the embeddings of every item here")
    p.add_argument("--bench", help="comma-separated batch sizes to time, e.g. 8,64,512")
    p.add_argument("--warmup", type=int, default=10, help="untimed batches per size first")
    p.add_argument("--iters", type=int, default=20, help="fewest timed batches per size")
    p.add_argument("--min-seconds", type=float, default=1.0, help="shortest timing per size (batches are added in tens)")
    p.add_argument(
        "--no-transfer",
        action="store_true",
        help="time the forward pass on device-resident inputs only (default: include the host-to-device "
        "copy of the ids and the copy of the embeddings back, as gpu.Model.Run does)",
    )
    args = p.parse_args(argv)
    if not args.out and not args.bench:
        p.error("nothing to do: give --out, --bench or both")

    import torch

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    # Full float32 GEMMs, as the Go backends compute: no TF32.
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    w = load_weights(torch, args.weights, device)
    tokens, offsets, vocab = load_batch(torch, args.batch)
    if vocab != w["embedding"].shape[0]:
        sys.exit(f"{args.batch} was tokenized for a vocabulary of {vocab}, the weights have {w['embedding'].shape[0]} rows")
    n = offsets.numel() - 1

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    with torch.inference_mode():
        if args.out:
            y = step(torch, w, tokens, offsets, device).contiguous()
            raw = bytes(y.view(torch.uint8).flatten().tolist()) if y.numel() else b""
            meta = {"format": EMBEDDINGS_FORMAT, "device": str(device), "torch": torch.__version__}
            write_safetensors(args.out, [("embeddings", "F32", list(y.shape), raw)], meta)

        for b in [int(s) for s in args.bench.split(",")] if args.bench else []:
            if not 1 <= b <= n:
                sys.exit(f"batch size {b}: the batch file holds {n} items")
            end = int(offsets[b])
            tok, off = tokens[:end], offsets[: b + 1]
            if args.no_transfer:
                tok_d, starts_d = tok.to(device).long(), off[:-1].to(device).long()

                def run():
                    return forward(torch, w, tok_d, starts_d)

            else:

                def run():
                    return step(torch, w, tok, off, device)

            for _ in range(args.warmup):
                run()
            sync()
            # At least --iters batches and --min-seconds, so that a small
            # batch's fast iterations still make a measurable span.
            iters, start = 0, time.perf_counter()
            while True:
                for _ in range(10):
                    run()
                iters += 10
                sync()
                secs = time.perf_counter() - start
                if iters >= args.iters and secs >= args.min_seconds:
                    break
            print(
                json.dumps(
                    {
                        "backend": "pytorch",
                        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else str(device),
                        "torch": torch.__version__,
                        "batch": b,
                        "tokens": end,
                        "iters": iters,
                        "transfer": not args.no_transfer,
                        "seconds": round(secs, 6),
                        "items_per_s": round(b * iters / secs, 1),
                    }
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
