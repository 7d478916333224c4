#!/usr/bin/env python3
"""PyTorch reference of vramq's BERT sentence encoder (model/bert, bert.CUDAEncoder).

Reads a model directory as Hugging Face saves one (config.json and
model.safetensors, F32/F16/BF16 widened to float32 as the Go loader does) and a
JSON file of token-id lists, and

  --out PATH    writes the sentence vectors of every item, one batch padded to
                the longest, as JSON {"embeddings": [[...], ...]} for Go to compare;
  --bench LIST --seq LIST
                times batches of B items of L tokens for each B in LIST and L
                in --seq, and prints one JSON line per shape with items/s.

--impl plain (the default) is the encoder written out here in PyTorch eager
(exact-erf GELU, additive mask of finfo.min, scores scaled by 1/sqrt(d));
--impl transformers runs transformers.BertModel on the same directory, where
that package is installed. --dtype float16 (or bfloat16) runs either in half
precision, as torch_dtype=float16 does (weights and activations in that type;
PyTorch's GEMMs and layer norm accumulate in float32); --attention sdpa uses
torch.nn.functional.scaled_dot_product_attention (flash or memory-efficient
kernels where they apply) instead of the explicit softmax(QK^T/sqrt(d))V. Pooling (--pooling mean|cls|max, --normalize) is
sentence-transformers'. Needs Python 3 and PyTorch; safetensors is parsed by
embed.py's reader (next to this file).

  python3 bench/torch/bert.py --model DIR --ids ids.json --out torch.json
  python3 bench/torch/bert.py --model DIR --ids ids.json --bench 8,32,128 --seq 32,128
"""

import argparse
import json
import math
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from embed import read_safetensors, to_tensor  # noqa: E402


def load_plain(torch, model_dir, device, dtype):
    with open(os.path.join(model_dir, "config.json")) as f:
        cfg = json.load(f)
    _, tensors = read_safetensors(os.path.join(model_dir, "model.safetensors"))
    prefix = "bert." if "bert.embeddings.word_embeddings.weight" in tensors else ""

    def get(name):
        return to_tensor(torch, *tensors[prefix + name]).float().to(device=device, dtype=dtype)

    w = {
        "word": get("embeddings.word_embeddings.weight"),
        "pos": get("embeddings.position_embeddings.weight"),
        "type": get("embeddings.token_type_embeddings.weight")[0],
        "ln": (get("embeddings.LayerNorm.weight"), get("embeddings.LayerNorm.bias")),
        "layers": [],
    }
    for i in range(cfg["num_hidden_layers"]):
        p = f"encoder.layer.{i}."
        lin = lambda n: (get(p + n + ".weight"), get(p + n + ".bias"))  # noqa: E731
        w["layers"].append(
            {
                "q": lin("attention.self.query"),
                "k": lin("attention.self.key"),
                "v": lin("attention.self.value"),
                "o": lin("attention.output.dense"),
                "ln1": lin("attention.output.LayerNorm"),
                "i": lin("intermediate.dense"),
                "out": lin("output.dense"),
                "ln2": lin("output.LayerNorm"),
            }
        )
    return cfg, w


def encode_plain(torch, cfg, w, ids, mask, sdpa=False):
    """The last hidden state [B, L, h] of ids [B, L] (int64), mask [B, L] (1 for a token), in the weights' dtype."""
    f = torch.nn.functional
    h, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    d, eps = h // heads, cfg.get("layer_norm_eps", 1e-12)
    b, l = ids.shape
    x = w["word"][ids] + w["pos"][:l].unsqueeze(0) + w["type"]
    x = f.layer_norm(x, (h,), *w["ln"], eps)
    dt = w["word"].dtype
    add = (1.0 - mask[:, None, None, :].to(dt)) * torch.finfo(dt).min
    split = lambda t: t.view(b, l, heads, d).transpose(1, 2)  # noqa: E731
    for lw in w["layers"]:
        q, k, v = (split(f.linear(x, *lw[n])) for n in ("q", "k", "v"))
        if sdpa:
            ctx = f.scaled_dot_product_attention(q, k, v, attn_mask=add)
        else:
            s = q @ k.transpose(-1, -2) / math.sqrt(d) + add
            ctx = s.softmax(-1) @ v
        ctx = ctx.transpose(1, 2).reshape(b, l, h)
        x = f.layer_norm(x + f.linear(ctx, *lw["o"]), (h,), *lw["ln1"], eps)
        inner = f.gelu(f.linear(x, *lw["i"]))  # exact erf
        x = f.layer_norm(x + f.linear(inner, *lw["out"]), (h,), *lw["ln2"], eps)
    return x


def pool(torch, x, mask, pooling, normalize):
    m = mask.unsqueeze(-1).float()
    if pooling == "cls":
        y = x[:, 0]
    elif pooling == "max":
        y = x.masked_fill(m == 0, -1e9).max(1).values
    else:
        y = (x * m).sum(1) / m.sum(1)
    return torch.nn.functional.normalize(y, dim=1) if normalize else y


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", required=True, help="model directory (config.json, model.safetensors)")
    p.add_argument("--ids", help="JSON file: a list of token-id lists ([CLS] ... [SEP])")
    p.add_argument("--impl", choices=["plain", "transformers"], default="plain")
    p.add_argument("--pooling", choices=["mean", "cls", "max"], default="mean")
    p.add_argument("--normalize", action="store_true")
    p.add_argument("--device", default=None, help="torch device (default: cuda when available, else cpu)")
    p.add_argument("--out", help="write the sentence vectors of --ids here (JSON)")
    p.add_argument("--bench", help="comma-separated batch sizes to time")
    p.add_argument("--seq", default="32,128", help="comma-separated sequence lengths to time")
    p.add_argument("--min-seconds", type=float, default=1.0)
    p.add_argument("--dtype", choices=["float32", "float16", "bfloat16"], default="float32")
    p.add_argument("--attention", choices=["eager", "sdpa"], default="eager")
    args = p.parse_args(argv)
    if not args.out and not args.bench:
        p.error("nothing to do: give --out, --bench or both")

    import torch

    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    dtype = getattr(torch, args.dtype)
    torch.backends.cuda.matmul.allow_tf32 = False  # full float32 GEMMs, as the Go backend
    torch.backends.cudnn.allow_tf32 = False
    if args.impl == "transformers":
        import transformers

        hf = transformers.BertModel.from_pretrained(args.model, add_pooling_layer=False, attn_implementation=args.attention)
        hf = hf.to(device=device, dtype=dtype).eval()
        cfg = hf.config.to_dict()

        def encode(ids, mask):
            return hf(input_ids=ids, attention_mask=mask).last_hidden_state

    else:
        cfg, w = load_plain(torch, args.model, device, dtype)

        def encode(ids, mask):
            return encode_plain(torch, cfg, w, ids, mask, sdpa=args.attention == "sdpa")

    def run(items):
        """One batch as bert.CUDAEncoder.Embed runs one: ids from the host, vectors back."""
        l = max(len(i) for i in items)
        ids = torch.zeros((len(items), l), dtype=torch.int64)
        mask = torch.zeros((len(items), l), dtype=torch.int64)
        for r, it in enumerate(items):
            ids[r, : len(it)] = torch.tensor(it)
            mask[r, : len(it)] = 1
        ids, mask = ids.to(device), mask.to(device)
        return pool(torch, encode(ids, mask).float(), mask, args.pooling, args.normalize).cpu()

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    with torch.inference_mode():
        if args.out:
            with open(args.ids) as f:
                items = json.load(f)
            y = run(items)
            with open(args.out, "w") as f:
                json.dump({"embeddings": y.tolist(), "impl": args.impl, "torch": torch.__version__, "device": str(device)}, f)
        for l in [int(s) for s in args.seq.split(",")] if args.bench else []:
            for b in [int(s) for s in args.bench.split(",")]:
                items = [[(r * 131 + q * 7 + 3) % cfg["vocab_size"] for q in range(l)] for r in range(b)]
                for _ in range(3):
                    run(items)
                sync()
                iters, start = 0, time.perf_counter()
                while True:
                    run(items)
                    iters += 1
                    sync()
                    secs = time.perf_counter() - start
                    if iters >= 5 and secs >= args.min_seconds:
                        break
                print(json.dumps({"impl": args.impl, "dtype": args.dtype, "attention": args.attention, "batch": b, "seq": l, "iters": iters, "seconds": round(secs, 6),
                                  "items_per_s": round(b * iters / secs, 1)}), flush=True)


if __name__ == "__main__":
    main()
