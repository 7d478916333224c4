// Kernels of the BERT encoder's CUDA backend (model/bert/cuda_encoder.go). The
// projections and the two attention products are cuBLAS GEMMs (plain and
// strided-batched); these are the steps around them. Compiled to PTX by
// `make ptx` with clang-14, without the CUDA headers or libdevice, so this
// file declares what it uses and brings its own exp and erf.
//
// Every parameter is a pointer, a 64-bit integer or a double:
// gorgonia.org/cu passes each kernel argument as 8 bytes.
//
// The arithmetic follows the CPU encoder (model/bert) where that is free:
// LayerNorm's mean and variance, mean pooling and the L2 norm accumulate in
// double; GELU is the exact form, x·Φ(x), with Φ from an erf accurate to
// float32 (bert_erf is there so tests can hold it against math.Erf).
//
// Block-wide reductions need blockDim.x to be a power of two, at most 1024.

#define GLOBAL __attribute__((global))
#define DEVICE __attribute__((device)) static inline
#define SHARED __attribute__((shared))
// UNROLL unrolls the next loop completely: a loop over a register array
// must be, or the array goes to local memory. (The emulator's g++ needs
// nothing unrolled.)
#if defined(__clang__)
#define UNROLL _Pragma("unroll")
#else
#define UNROLL
#endif

typedef long i64;

// Everything lives in a namespace of its own, the kernels' names declared
// outside it at the end: the emulator compiles this file into one
// translation unit with embed.cu, which has helpers of the same names.
namespace bertk {

DEVICE int tid(void) { return __nvvm_read_ptx_sreg_tid_x(); }
DEVICE int ntid(void) { return __nvvm_read_ptx_sreg_ntid_x(); }
DEVICE int ctaid(void) { return __nvvm_read_ptx_sreg_ctaid_x(); }
DEVICE int nctaid(void) { return __nvvm_read_ptx_sreg_nctaid_x(); }

// The largest finite float: the additive mask of a padded key, as
// Hugging Face's BERT uses torch.finfo(float32).min.
const float float_max = 3.40282347e38f;

// block_sum returns the sum of every thread's v to every thread of the
// block, through part (blockDim.x doubles of shared memory).
DEVICE double block_sum(double v, double *part) {
	part[tid()] = v;
	__syncthreads();
	for (int s = ntid() / 2; s > 0; s >>= 1) {
		if (tid() < s) {
			part[tid()] += part[tid() + s];
		}
		__syncthreads();
	}
	double total = part[0];
	__syncthreads(); // everyone has read part[0] before part is reused
	return total;
}

// block_max is block_sum's maximum.
DEVICE double block_max(double v, double *part) {
	part[tid()] = v;
	__syncthreads();
	for (int s = ntid() / 2; s > 0; s >>= 1) {
		if (tid() < s && part[tid() + s] > part[tid()]) {
			part[tid()] = part[tid() + s];
		}
		__syncthreads();
	}
	double m = part[0];
	__syncthreads();
	return m;
}

// exp_f is e^x to about 1 ulp: x = n·ln2 + r with |r| ≤ ln2/2 (ln2 split
// in two so that n·ln2 is exact), e^r by its Taylor series to r^8 (the
// remainder is below 2^-27 relative), and 2^n put into the exponent bits.
DEVICE float exp_f(float x) {
	if (x < -103.0f) {
		return 0.0f;
	}
	if (x > 88.7f) {
		return __builtin_bit_cast(float, 0x7f800000); // +inf
	}
	float n = __builtin_rintf(x * 1.44269504f);
	float r = x - n * 0.693145752f; // ln2's upper bits: n·this is exact
	r = r - n * 1.42860677e-6f;     // the rest of ln2
	float p = 1.0f / 40320.0f;
	p = p * r + 1.0f / 5040.0f;
	p = p * r + 1.0f / 720.0f;
	p = p * r + 1.0f / 120.0f;
	p = p * r + 1.0f / 24.0f;
	p = p * r + 1.0f / 6.0f;
	p = p * r + 0.5f;
	p = p * r + 1.0f;
	p = p * r + 1.0f;
	int k = (int)n;
	// 2^k in two steps, so that k below -126 (a subnormal result) works.
	int k1 = k / 2, k2 = k - k1;
	float s1 = __builtin_bit_cast(float, (k1 + 127) << 23);
	float s2 = __builtin_bit_cast(float, (k2 + 127) << 23);
	return p * s1 * s2;
}

// erfc_f is erfc(z) for z ≥ 1, with relative error about 1.2e-7: the
// Chebyshev-fitted form t·exp(-z² + P(t)), t = 1/(1 + z/2), whose
// coefficients are those of Numerical Recipes' erfcc (its stated
// fractional error is below 1.2e-7 for every z ≥ 0).
DEVICE float erfc_f(float z) {
	float t = 1.0f / (1.0f + 0.5f * z);
	float p = 0.17087277f;
	p = p * t - 0.82215223f;
	p = p * t + 1.48851587f;
	p = p * t - 1.13520398f;
	p = p * t + 0.27886807f;
	p = p * t - 0.18628806f;
	p = p * t + 0.09678418f;
	p = p * t + 0.37409196f;
	p = p * t + 1.00002368f;
	p = p * t - 1.26551223f;
	return t * exp_f(p - z * z);
}

// erf_small is erf(z) for |z| < 1 from its Maclaurin series to z^27,
// whose remainder there is below 3e-12 relative: relative accuracy near 0,
// where 1 - erfc would lose it.
DEVICE float erf_small(float z) {
	float z2 = z * z;
	// 2/√π · Σ (-1)^n z^(2n+1) / (n! (2n+1)), Horner in z², n = 0 … 13.
	const float c[14] = {1.0f, -1.0f / 3.0f, 1.0f / 10.0f, -1.0f / 42.0f, 1.0f / 216.0f, -1.0f / 1320.0f,
		1.0f / 9360.0f, -1.0f / 75600.0f, 1.0f / 685440.0f, -1.0f / 6894720.0f, 1.0f / 76204800.0f,
		-1.0f / 918086400.0f, 1.0f / 11975040000.0f, -1.0f / 168129561600.0f};
	float p = c[13];
	for (int i = 12; i >= 0; i--) {
		p = p * z2 + c[i];
	}
	return 1.1283791671f * z * p; // 2/√π
}

DEVICE float erf_f(float z) {
	float a = z < 0.0f ? -z : z;
	if (a < 1.0f) {
		return erf_small(z);
	}
	float e = 1.0f - erfc_f(a);
	return z < 0.0f ? -e : e;
}

// phi is the standard normal CDF Φ(v) = (1 + erf(v/√2))/2, from erfc in
// the lower tail, where 1 + erf would cancel to nothing.
DEVICE float phi(float v) {
	float z = v * 0.70710678118654752f;
	if (z <= -1.0f) {
		return 0.5f * erfc_f(-z);
	}
	return 0.5f * (1.0f + erf_f(z));
}

// layernorm_row normalizes row (width h, already summed with whatever
// precedes the norm) to mean 0 and variance 1 with gamma and beta, as the
// CPU does: moments in double.
DEVICE void layernorm_row(float *row, const float *gamma, const float *beta, i64 h, double eps, double *part) {
	double s = 0.0;
	for (i64 j = tid(); j < h; j += ntid()) {
		s += row[j];
	}
	double mean = block_sum(s, part) / (double)h;
	double ss = 0.0;
	for (i64 j = tid(); j < h; j += ntid()) {
		double d = (double)row[j] - mean;
		ss += d * d;
	}
	double inv = 1.0 / __builtin_sqrt(block_sum(ss, part) / (double)h + eps);
	for (i64 j = tid(); j < h; j += ntid()) {
		row[j] = (float)(((double)row[j] - mean) * inv) * gamma[j] + beta[j];
	}
}


// bert_embed sets each row r of x ([rows, h], rows = items × seqLen) to
// LayerNorm(word[ids[r]] + pos[r mod seqLen] + type0): one block per row
// (grid-stride over rows), threads across the width.
extern "C" GLOBAL void bert_embed(const int *ids, const float *word, const float *pos, const float *type0,
	const float *gamma, const float *beta, float *x, i64 rows, i64 seq_len, i64 h, double eps) {
	SHARED double part[1024];
	for (i64 r = ctaid(); r < rows; r += nctaid()) {
		float *row = x + r * h;
		const float *w = word + (i64)ids[r] * h, *p = pos + (r % seq_len) * h;
		for (i64 j = tid(); j < h; j += ntid()) {
			row[j] = w[j] + p[j] + type0[j];
		}
		// No barrier: layernorm_row's threads read the columns they wrote.
		layernorm_row(row, gamma, beta, h, eps, part);
	}
}

// bert_add_layernorm sets each row of x to LayerNorm(x + y + bias): the
// residual connection after a projection y (without its bias), then the
// norm. One block per row.
extern "C" GLOBAL void bert_add_layernorm(float *x, const float *y, const float *bias, const float *gamma,
	const float *beta, i64 rows, i64 h, double eps) {
	SHARED double part[1024];
	for (i64 r = ctaid(); r < rows; r += nctaid()) {
		float *row = x + r * h;
		const float *yr = y + r * h;
		for (i64 j = tid(); j < h; j += ntid()) {
			row[j] = row[j] + (yr[j] + bias[j]);
		}
		layernorm_row(row, gamma, beta, h, eps, part);
	}
}

DEVICE unsigned short half_bits(float f, i64 bf16);

// bert_split_heads adds the bias to the fused query/key/value projection
// qkv ([items·seqLen, 3h]) and lays it out head by head, as three
// [items·heads, seqLen, d] blocks (Q, K, V), so that each attention
// product is one strided-batched GEMM: into out in float32 (prec 0), or
// rounded to binary16 (1) or bfloat16 (2) into out16 (out then unused),
// where the attention reads Q, K and V in half precision only, so that
// they never make a float32 round trip. Grid-stride over every element.
extern "C" GLOBAL void bert_split_heads(const float *qkv, const float *bias, float *out, unsigned short *out16,
	i64 items, i64 seq_len, i64 heads, i64 d, i64 prec) {
	i64 h = heads * d, total = items * seq_len * 3 * h;
	for (i64 k = (i64)ctaid() * ntid() + tid(); k < total; k += (i64)nctaid() * ntid()) {
		i64 r = k / (3 * h), c = k - r * 3 * h;
		i64 which = c / h, hd = (c - which * h) / d, e = c - which * h - hd * d;
		i64 b = r / seq_len, p = r - b * seq_len;
		i64 at = ((which * items + b) * heads + hd) * seq_len * d + p * d + e;
		float x = qkv[k] + bias[c];
		if (prec) {
			out16[at] = half_bits(x, prec == 2);
		} else {
			out[at] = x;
		}
	}
}

// bert_merge_heads is the inverse layout for the attention's output: from
// [items·heads, seqLen, d] to [items·seqLen, h].
extern "C" GLOBAL void bert_merge_heads(const float *in, float *ctx, i64 items, i64 seq_len, i64 heads, i64 d) {
	i64 h = heads * d, total = items * seq_len * h;
	for (i64 k = (i64)ctaid() * ntid() + tid(); k < total; k += (i64)nctaid() * ntid()) {
		i64 r = k / h, c = k - r * h;
		i64 hd = c / d, e = c - hd * d;
		i64 b = r / seq_len, p = r - b * seq_len;
		ctx[k] = in[((b * heads + hd) * seq_len + p) * d + e];
	}
}

// bert_softmax replaces each row of the attention scores ([items·heads·
// seqLen, seqLen]: one row per query) by softmax(row·scale + mask), the mask
// adding -FLT_MAX at the keys past the item's length lens[item], which
// makes their weight exactly 0. One block per row.
extern "C" GLOBAL void bert_softmax(float *s, const int *lens, i64 nrows, i64 seq_len, i64 heads, double scale) {
	SHARED double part[1024];
	float sc = (float)scale;
	for (i64 r = ctaid(); r < nrows; r += nctaid()) {
		float *row = s + r * seq_len;
		i64 len = lens[r / (heads * seq_len)];
		double mx = -3.4e38;
		for (i64 j = tid(); j < seq_len; j += ntid()) {
			float v = row[j] * sc + (j < len ? 0.0f : -float_max);
			row[j] = v;
			mx = v > mx ? v : mx;
		}
		float m = (float)block_max(mx, part);
		double sum = 0.0;
		for (i64 j = tid(); j < seq_len; j += ntid()) {
			float e = exp_f(row[j] - m);
			row[j] = e;
			sum += e;
		}
		float inv = (float)(1.0 / block_sum(sum, part));
		for (i64 j = tid(); j < seq_len; j += ntid()) {
			row[j] *= inv;
		}
	}
}

// bert_attention is the attention of every (item, head, query) row in one
// kernel, softmax(q·Kᵀ·scale + mask)·V, without the scores matrix: one block
// per row (grid-stride over the items·heads·seqLen rows of qo, laid out as
// bert_split_heads leaves Q, K and V), the keys in tiles of blockDim.x. Each
// tile's scores live in registers and one shared row; the softmax is the
// online one: a running maximum m and sum l, the accumulator rescaled by
// e^(m_old - m_new) whenever a tile raises the maximum, the output acc/l at
// the end. Keys past the item's length lens[item] are never read (the
// unfused softmax gives them weight exactly 0). The output overwrites the
// query row, which only this block reads. blockDim.x must be a power of two
// of at least d (each of the first d threads accumulates one output
// component) and at most 1024.
//
// Memory: the scores of one tile per block, so a batch needs nothing that
// grows with seqLen² (the unfused path's items·heads·seqLen² floats).
extern "C" GLOBAL void bert_attention(float *qo, const float *k, const float *v, const int *lens, i64 nrows,
	i64 seq_len, i64 heads, i64 d, double scale) {
	SHARED float qs[1024];
	SHARED float ps[1024];
	SHARED double part[1024];
	float sc = (float)scale;
	i64 tile = ntid();
	for (i64 r = ctaid(); r < nrows; r += nctaid()) {
		float *q = qo + r * d;
		const float *kb = k + (r / seq_len) * seq_len * d, *vb = v + (r / seq_len) * seq_len * d;
		i64 len = lens[r / (heads * seq_len)];
		for (i64 e = tid(); e < d; e += ntid()) {
			qs[e] = q[e];
		}
		__syncthreads(); // the whole query row before any dot product
		float m = -float_max, l = 0.0f, acc = 0.0f;
		for (i64 j0 = 0; j0 < len; j0 += tile) {
			i64 j = j0 + tid();
			float s = -float_max;
			if (j < len) {
				float dot = 0.0f;
				for (i64 e = 0; e < d; e++) {
					dot += qs[e] * kb[j * d + e];
				}
				s = dot * sc;
			}
			// block_max's barriers also order this tile's reads of ps and
			// qs (the last tile's, the last row's) before their next writes.
			float mt = (float)block_max(s, part);
			float mn = mt > m ? mt : m;
			float p = j < len ? exp_f(s - mn) : 0.0f;
			ps[tid()] = p;
			double sum = block_sum(p, part); // its first barrier publishes ps
			float corr = exp_f(m - mn);
			l = l * corr + (float)sum;
			if (tid() < d) {
				i64 n = len - j0 < tile ? len - j0 : tile;
				float a = acc * corr;
				for (i64 t = 0; t < n; t++) {
					a += ps[t] * vb[(j0 + t) * d + tid()];
				}
				acc = a;
			}
			m = mn;
		}
		if (tid() < d) {
			q[tid()] = acc / l;
		}
	}
}

// Tiles of bert_attention_tiled: a K tile and a V tile of tiled_floats
// floats each in shared memory (2 × 16 KiB, within the 48 KiB a block may
// declare statically), so a tile holds tiled_floats/D keys: 64 at D = 64,
// 128 at D = 32. Each query takes its scores tiled_chunk keys at a time, in
// registers (the loops over a chunk are unrolled: 8 keys keep the PTX of
// the two instances under 400 KB), and rescales its accumulator only when a
// chunk raises its maximum.
const int tiled_max_d = 64;

// f4 is four floats loaded or stored as one (ld.shared.v4.f32): the
// tiled kernel's inner loops read a tile four components at a time, one
// shared load per four multiply-adds rather than one per one.
typedef float f4 __attribute__((vector_size(16), may_alias));
const int tiled_floats = 64 * 64;
const int tiled_chunk = 8;

// half_float is the float32 value of binary16 (bf16 0) or bfloat16 (bf16 1)
// bits h: exact, subnormals, infinities and NaN included.
DEVICE float half_float(unsigned short h, i64 bf16) {
	unsigned x = h;
	if (bf16) {
		return __builtin_bit_cast(float, x << 16);
	}
	unsigned sign = (x & 0x8000u) << 16, e = (x >> 10) & 0x1fu, m = x & 0x3ffu;
	if (e == 0x1fu) {
		return __builtin_bit_cast(float, sign | 0x7f800000u | (m << 13));
	}
	if (e == 0) {
		float v = (float)m * 5.96046448e-8f; // m·2^-24, exact
		return sign ? -v : v;
	}
	return __builtin_bit_cast(float, sign | ((e + 112u) << 23) | (m << 13));
}

// load_qkv is element i of Q, K or V: float32 (prec 0), binary16 (1) or
// bfloat16 (2).
DEVICE float load_qkv(const void *p, i64 i, i64 prec) {
	if (prec == 0) {
		return ((const float *)p)[i];
	}
	return half_float(((const unsigned short *)p)[i], prec == 2);
}

// attention_tiles is bert_attention_tiled for heads of at most D
// components (D = 32 or 64; a narrower head is zero-padded to D, which adds
// 0 to every dot product and output component past d). ks and vs are the
// block's shared K and V tiles, declared by the kernel so that the two
// instances share them.
template <int D>
DEVICE void attention_tiles(const void *qp, const void *kp, const void *vp, float *out, const int *lens, i64 nbh,
	i64 seq_len, i64 heads, i64 d, float sc, i64 prec, float *ks, float *vs) {
	const i64 bk = tiled_floats / D, bq = ntid(), nqt = (seq_len + bq - 1) / bq;
	for (i64 blk = ctaid(); blk < nbh * nqt; blk += nctaid()) {
		i64 bh = blk / nqt, q0 = (blk - bh * nqt) * bq, len = lens[bh / heads];
		if (q0 >= len) {
			continue; // every query of the tile is padding: the whole block skips it
		}
		i64 i = q0 + tid(), base = bh * seq_len * d;
		bool live = i < len;
		float q[D], o[D];
		UNROLL
		for (int e = 0; e < D; e++) {
			q[e] = live && e < d ? load_qkv(qp, base + i * d + e, prec) : 0.0f;
			o[e] = 0.0f;
		}
		float m = -float_max, l = 0.0f;
		for (i64 j0 = 0; j0 < len; j0 += bk) {
			i64 n = len - j0 < bk ? len - j0 : bk;
			__syncthreads(); // every query is done with the last tile (this tile's or the block's previous one) before it is overwritten
			for (i64 x = tid(); x < n * D; x += ntid()) {
				i64 t = x / D, e = x - t * D;
				ks[x] = e < d ? load_qkv(kp, base + (j0 + t) * d + e, prec) : 0.0f;
				vs[x] = e < d ? load_qkv(vp, base + (j0 + t) * d + e, prec) : 0.0f;
			}
			__syncthreads(); // the whole tile before any query reads it
			if (!live) {
				continue; // a padded query only helps load the tiles
			}
			for (i64 c0 = 0; c0 < n; c0 += tiled_chunk) {
				float s[tiled_chunk];
				float mc = m;
				UNROLL
				for (int t = 0; t < tiled_chunk; t++) {
					s[t] = -float_max;
					if (c0 + t < n) {
						const f4 *kr = (const f4 *)(ks + (c0 + t) * D);
						float dot = 0.0f;
						UNROLL
						for (int e = 0; e < D; e += 4) {
							f4 k4 = kr[e / 4];
							dot += q[e] * k4[0] + q[e + 1] * k4[1] + q[e + 2] * k4[2] + q[e + 3] * k4[3];
						}
						s[t] = dot * sc;
						mc = s[t] > mc ? s[t] : mc;
					}
				}
				if (mc > m) { // rarely after the first chunks: the scores' maximum settles
					float corr = exp_f(m - mc);
					l *= corr;
					UNROLL
					for (int e = 0; e < D; e++) {
						o[e] *= corr;
					}
					m = mc;
				}
				UNROLL
				for (int t = 0; t < tiled_chunk; t++) {
					if (c0 + t < n) {
						float p = exp_f(s[t] - mc);
						const f4 *vr = (const f4 *)(vs + (c0 + t) * D);
						l += p;
						UNROLL
						for (int e = 0; e < D; e += 4) {
							f4 v4 = vr[e / 4];
							o[e] += p * v4[0];
							o[e + 1] += p * v4[1];
							o[e + 2] += p * v4[2];
							o[e + 3] += p * v4[3];
						}
					}
				}
			}
		}
		if (live) {
			UNROLL
			for (int e = 0; e < D; e++) {
				if (e < d) {
					out[base + i * d + e] = o[e] / l;
				}
			}
		}
	}
}

// bert_attention_tiled is bert_attention with the queries tiled as well as
// the keys (FlashAttention's shape): one block per tile of blockDim.x
// queries of one (item, head), grid-stride over the items·heads·⌈seqLen/
// blockDim.x⌉ tiles; each K and V tile is loaded into shared memory once
// and every query of the block uses it, so K and V are read from global
// memory ⌈seqLen/blockDim.x⌉ times per (item, head), not seqLen times. Each
// thread owns one query: its q and its output accumulator in registers,
// its running maximum and sum (the online softmax, in float32, the
// accumulator rescaled when a chunk of keys raises the maximum) its own, so no reduction crosses threads. q, k and
// v are laid out as bert_split_heads leaves Q, K and V, in float32 (prec
// 0), binary16 (1) or bfloat16 (2); out ([items·heads, seqLen, d], float32)
// may be q itself in float32, since a query row is read only by its own
// block. Keys past the item's length lens[item] are never read. Neither are
// padded queries (rows at or past lens[item]), nor written: nothing reads
// them after (the later layers' attention masks them as keys, every other
// step works row by row and pooling stops at the length). d must be at
// most tiled_max_d (the encoder keeps bert_attention for wider heads: a
// thread holds 2·d floats). Shared memory: two tiles of tiled_floats
// floats, 32 KiB, whatever d and blockDim.x; device memory: none.
extern "C" GLOBAL void bert_attention_tiled(const void *q, const void *k, const void *v, float *out, const int *lens,
	i64 nbh, i64 seq_len, i64 heads, i64 d, double scale, i64 prec) {
	SHARED __attribute__((aligned(16))) float ks[tiled_floats];
	SHARED __attribute__((aligned(16))) float vs[tiled_floats];
	float sc = (float)scale;
	if (d <= 32) {
		attention_tiles<32>(q, k, v, out, lens, nbh, seq_len, heads, d, sc, prec, ks, vs);
	} else if (d <= tiled_max_d) {
		attention_tiles<64>(q, k, v, out, lens, nbh, seq_len, heads, d, sc, prec, ks, vs);
	}
}

// bert_bias_gelu sets x[i][j] = GELU(x[i][j] + bias[j]) for an n×width
// row-major x, in the exact form v·Φ(v) (Hugging Face's "gelu").
extern "C" GLOBAL void bert_bias_gelu(float *x, const float *bias, i64 n, i64 width) {
	i64 total = n * width;
	for (i64 k = (i64)ctaid() * ntid() + tid(); k < total; k += (i64)nctaid() * ntid()) {
		float v = x[k] + bias[k % width];
		x[k] = v * phi(v);
	}
}

// bert_erf sets y[i] = erf(x[i]): the erf GELU uses, for tests.
extern "C" GLOBAL void bert_erf(const float *x, float *y, i64 n) {
	for (i64 k = (i64)ctaid() * ntid() + tid(); k < n; k += (i64)nctaid() * ntid()) {
		y[k] = erf_f(x[k]);
	}
}

// bert_pool sets out[b] ([items, h]) to item b's sentence vector over its
// first lens[b] rows of x ([items·seqLen, h]): mode 0 the mean (summed in
// double, in token order), 1 the [CLS] row, 2 the maximum. Padding is never
// read. One block per item, threads across the width.
extern "C" GLOBAL void bert_pool(const float *x, const int *lens, float *out, i64 items, i64 seq_len, i64 h, i64 mode) {
	for (i64 b = ctaid(); b < items; b += nctaid()) {
		const float *rows = x + b * seq_len * h;
		i64 n = lens[b];
		for (i64 j = tid(); j < h; j += ntid()) {
			float v;
			if (mode == 1) {
				v = rows[j];
			} else if (mode == 2) {
				v = rows[j];
				for (i64 t = 1; t < n; t++) {
					float u = rows[t * h + j];
					v = u > v ? u : v;
				}
			} else {
				double s = 0.0;
				for (i64 t = 0; t < n; t++) {
					s += rows[t * h + j];
				}
				v = (float)(s / (double)n);
			}
			out[b * h + j] = v;
		}
	}
}

// half_bits rounds f to IEEE 754 binary16 (bf16 0) or to bfloat16 (bf16 1),
// to nearest even, by integer arithmetic on its bits (this file has no
// cuda_fp16.h): the rounding of cvt.rn, and of gpu/cuda.HalfBits, which
// converts the weights.
DEVICE unsigned short half_bits(float f, i64 bf16) {
	union {
		float f;
		unsigned u;
	} v = {f};
	unsigned x = v.u, ax = x & 0x7fffffffu;
	if (bf16) {
		if (ax > 0x7f800000u) {
			return (unsigned short)((x >> 16) | 0x40u);
		}
		return (unsigned short)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
	}
	unsigned short sign = (unsigned short)((x >> 16) & 0x8000u);
	if (ax > 0x7f800000u) {
		return sign | 0x7e00u | (unsigned short)((ax >> 13) & 0x3ffu);
	}
	if (ax >= 0x477ff000u) {
		return sign | 0x7c00u; // 65520 and up: infinity
	}
	if (ax < 0x33000000u) {
		return sign; // below 2^-25: zero
	}
	if (ax < 0x38800000u) { // a subnormal, in units of 2^-24
		unsigned e = ax >> 23, m = (ax & 0x7fffffu) | 0x800000u, shift = 126 - e;
		unsigned hm = m >> shift, rem = m & ((1u << shift) - 1), halfway = 1u << (shift - 1);
		if (rem > halfway || (rem == halfway && (hm & 1u))) {
			hm++;
		}
		return sign | (unsigned short)hm;
	}
	unsigned hm = (ax >> 13) - (112u << 10), rem = ax & 0x1fffu;
	if (rem > 0x1000u || (rem == 0x1000u && (hm & 1u))) {
		hm++;
	}
	return sign | (unsigned short)hm;
}

// bert_to_half sets y[i] to x[i] rounded to binary16 (bf16 0) or bfloat16
// (bf16 1): the operands of a half-precision GEMM, from the float32
// activations every other kernel reads and writes. Grid-stride.
extern "C" GLOBAL void bert_to_half(const float *x, unsigned short *y, i64 n, i64 bf16) {
	for (i64 k = (i64)ctaid() * ntid() + tid(); k < n; k += (i64)nctaid() * ntid()) {
		y[k] = half_bits(x[k], bf16);
	}
}

// bert_l2norm scales each row of y ([n, width]) to unit length, dividing
// by max(‖row‖, 1e-12) as torch.nn.functional.normalize does. One block
// per row.
extern "C" GLOBAL void bert_l2norm(float *y, i64 n, i64 width) {
	SHARED double part[1024];
	for (i64 i = ctaid(); i < n; i += nctaid()) {
		float *row = y + i * width;
		double ss = 0.0;
		for (i64 j = tid(); j < width; j += ntid()) {
			ss += (double)row[j] * (double)row[j];
		}
		double norm = __builtin_sqrt(block_sum(ss, part));
		double inv = 1.0 / (norm > 1e-12 ? norm : 1e-12);
		for (i64 j = tid(); j < width; j += ntid()) {
			row[j] = (float)((double)row[j] * inv);
		}
	}
}

} // namespace bertk

using bertk::bert_embed;
using bertk::bert_add_layernorm;
using bertk::bert_split_heads;
using bertk::bert_merge_heads;
using bertk::bert_softmax;
using bertk::bert_bias_gelu;
using bertk::bert_erf;
using bertk::bert_pool;
using bertk::bert_l2norm;
using bertk::bert_to_half;
using bertk::bert_attention;
using bertk::bert_attention_tiled;
