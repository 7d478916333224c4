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
// Reductions are warp shuffles (every shuffle names all 32 lanes of a warp,
// so blockDim.x must be a multiple of 32): the row-wise kernels
// (bert_embed, bert_add_layernorm, bert_softmax, bert_l2norm) give each row
// one warp, without shared memory or barriers; bert_attention's block-wide
// ones combine its warps' results through shared memory after one barrier.

#define GLOBAL __attribute__((global))
#define DEVICE __attribute__((device)) static inline
#define SHARED __attribute__((shared))
// INLINE inlines a function into its caller whatever its size: a row's
// helpers and the lambdas that warp_rows calls must be, or a closure's
// captures go to local memory and a row's registers cross a call. (Without
// it, clang-14 leaves bert_softmax's out of line.)
#define INLINE __attribute__((always_inline))
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

// full_warp names every lane of a warp: the row-wise kernels' shuffles are
// executed by all 32 lanes together (a warp's lanes share their row, so
// they take the same branches around each shuffle).
const unsigned full_warp = 0xffffffffu;

DEVICE i64 lane(void) { return tid() & 31; }

#if defined(__NVPTX__)
// f16_float is cvt.f32.f16, binary16 bits to float32, exact. clang-14 has
// no NVVM builtin for it, but converts an __fp16 with that instruction. The
// emulator's prelude defines f16_float for its g++, which has no __fp16 on
// x86-64; it also defines __nvvm_f2h_rn and __nvvm_f2bf16_rn (half_bits).
DEVICE float f16_float(unsigned short h) { return (float)__builtin_bit_cast(__fp16, h); }
#endif

// shfl_xor_f and shfl_xor_d are lane ^ m's v (PTX shfl.sync.bfly; c = 31:
// the whole warp is one segment); a double travels as its two halves.
DEVICE float shfl_xor_f(float v, int m) {
	return __builtin_bit_cast(float, __nvvm_shfl_sync_bfly_i32(full_warp, __builtin_bit_cast(int, v), m, 31));
}

DEVICE double shfl_xor_d(double v, int m) {
	unsigned long b = __builtin_bit_cast(unsigned long, v);
	unsigned lo = (unsigned)__nvvm_shfl_sync_bfly_i32(full_warp, (int)(unsigned)b, m, 31);
	unsigned hi = (unsigned)__nvvm_shfl_sync_bfly_i32(full_warp, (int)(unsigned)(b >> 32), m, 31);
	return __builtin_bit_cast(double, (unsigned long)hi << 32 | lo);
}

// warp_sum is the sum of every lane's v, to every lane: a butterfly, in
// which both lanes of a pair add the same two values, so every lane ends
// with the same bits.
DEVICE double warp_sum(double v) {
	for (int m = 16; m > 0; m >>= 1) {
		v += shfl_xor_d(v, m);
	}
	return v;
}

// warp_max is warp_sum's maximum.
DEVICE float warp_max(float v) {
	for (int m = 16; m > 0; m >>= 1) {
		float u = shfl_xor_f(v, m);
		v = u > v ? u : v;
	}
	return v;
}

// warp_rows calls row(r) for each of n rows, a warp a row: grid-stride
// over the warps of the grid, so that any grid covers every row. Always
// inlined, and row takes what it uses by value: a kernel's locals captured
// by reference by a function left out of line live in local memory.
template <class Row>
INLINE DEVICE void warp_rows(i64 n, Row row) {
	i64 warps = ntid() / 32;
	for (i64 r = (i64)ctaid() * warps + tid() / 32; r < n; r += (i64)nctaid() * warps) {
		row(r);
	}
}

// block_sum returns the sum of every thread's v to every thread of the
// block: each warp sums by shuffles, its lane 0 leaves the warp's sum in
// part (a double a warp), and after one barrier every thread adds the
// warps' sums in the same order (so all get the same bits). Nothing orders
// the reads of part before its next writes: a caller must not pass the
// same part again before another barrier (bert_attention alternates two).
DEVICE double block_sum(double v, double *part) {
	v = warp_sum(v);
	if (lane() == 0) {
		part[tid() / 32] = v;
	}
	__syncthreads();
	double total = 0.0;
	for (int w = 0; w < ntid() / 32; w++) {
		total += part[w];
	}
	return total;
}

// block_max is block_sum's maximum.
DEVICE float block_max(float v, float *part) {
	v = warp_max(v);
	if (lane() == 0) {
		part[tid() / 32] = v;
	}
	__syncthreads();
	float m = part[0];
	for (int w = 1; w < ntid() / 32; w++) {
		m = part[w] > m ? part[w] : m;
	}
	return m;
}

// row_regs is the most columns a lane keeps in registers: a row of up to
// 32·row_regs values (every BERT's hidden width and sequence length) is
// read from memory once and written once. A wider one goes through memory.
const int row_regs = 32;

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

// half_bits and load_qkv (below) round to and read the half-precision
// operands of the GEMMs.
DEVICE unsigned short half_bits(float f, i64 bf16);
DEVICE float load_qkv(const void *p, i64 i, i64 prec);

// put_half sets row[j] to y and, with prec 1 or 2, x16[j] to y rounded to
// binary16 or bfloat16: the half-precision copy of the hidden state that
// the next GEMM reads, written by the lane that writes the float32 value,
// so that no separate pass converts it and nothing orders the two writes.
DEVICE void put_half(float *row, unsigned short *x16, i64 j, float y, i64 prec) {
	row[j] = y;
	if (prec) {
		x16[j] = half_bits(y, prec == 2);
	}
}

// layernorm_regs sets row (width h ≤ 32·K) to LayerNorm(x) with gamma and
// beta, where x[j] = at(j) (the row summed with whatever precedes the
// norm), as the CPU does: moments in double. One warp: lane l holds
// columns l, l+32, … in registers. x16 and prec as put_half's.
template <int K, class At>
INLINE DEVICE void layernorm_regs(float *row, At at, const float *gamma, const float *beta, i64 h, double eps,
	unsigned short *x16, i64 prec) {
	float x[K];
	double s = 0.0;
	UNROLL
	for (int t = 0; t < K; t++) {
		i64 j = lane() + 32 * t;
		x[t] = j < h ? at(j) : 0.0f;
		s += x[t];
	}
	double mean = warp_sum(s) / (double)h;
	double ss = 0.0;
	UNROLL
	for (int t = 0; t < K; t++) {
		if (lane() + 32 * t < h) {
			double d = (double)x[t] - mean;
			ss += d * d;
		}
	}
	double inv = 1.0 / __builtin_sqrt(warp_sum(ss) / (double)h + eps);
	UNROLL
	for (int t = 0; t < K; t++) {
		i64 j = lane() + 32 * t;
		if (j < h) {
			put_half(row, x16, j, (float)(((double)x[t] - mean) * inv) * gamma[j] + beta[j], prec);
		}
	}
}

// layernorm_row is layernorm_regs for any width: in registers sized to the
// row up to 32·row_regs, through memory past it.
template <class At>
INLINE DEVICE void layernorm_row(float *row, At at, const float *gamma, const float *beta, i64 h, double eps,
	unsigned short *x16, i64 prec) {
	if (h <= 32 * 8) {
		layernorm_regs<8>(row, at, gamma, beta, h, eps, x16, prec);
	} else if (h <= 32 * 16) {
		layernorm_regs<16>(row, at, gamma, beta, h, eps, x16, prec);
	} else if (h <= 32 * row_regs) {
		layernorm_regs<row_regs>(row, at, gamma, beta, h, eps, x16, prec);
	} else {
		double s = 0.0;
		for (i64 j = lane(); j < h; j += 32) {
			row[j] = at(j);
			s += row[j];
		}
		// No shuffle orders these: each lane reads back only what it wrote.
		double mean = warp_sum(s) / (double)h;
		double ss = 0.0;
		for (i64 j = lane(); j < h; j += 32) {
			double d = (double)row[j] - mean;
			ss += d * d;
		}
		double inv = 1.0 / __builtin_sqrt(warp_sum(ss) / (double)h + eps);
		for (i64 j = lane(); j < h; j += 32) {
			put_half(row, x16, j, (float)(((double)row[j] - mean) * inv) * gamma[j] + beta[j], prec);
		}
	}
}

// bert_embed sets each row r of x ([rows, h], rows = items × seqLen) to
// LayerNorm(word[ids[r]] + pos[r mod seqLen] + type0): one warp per row
// (grid-stride over rows), its lanes across the width. With prec 1 or 2 it
// also writes each row to x16 in half precision (put_half); x16 is then
// unused with prec 0.
extern "C" GLOBAL void bert_embed(const int *ids, const float *word, const float *pos, const float *type0,
	const float *gamma, const float *beta, float *x, i64 rows, i64 seq_len, i64 h, double eps, unsigned short *x16,
	i64 prec) {
	warp_rows(rows, [=](i64 r) INLINE {
		const float *w = word + (i64)ids[r] * h, *p = pos + (r % seq_len) * h;
		layernorm_row(x + r * h, [=](i64 j) { return w[j] + p[j] + type0[j]; }, gamma, beta, h, eps, x16 + r * h, prec);
	});
}

// bert_add_layernorm sets each row of x to LayerNorm(x + y + bias): the
// residual connection after a projection y (without its bias), then the
// norm. One warp per row. x16 and prec as bert_embed's: x stays float32
// for the next residual sum and LayerNorm, x16 is what the next GEMM reads.
extern "C" GLOBAL void bert_add_layernorm(float *x, const float *y, const float *bias, const float *gamma,
	const float *beta, i64 rows, i64 h, double eps, unsigned short *x16, i64 prec) {
	warp_rows(rows, [=](i64 r) INLINE {
		float *row = x + r * h;
		const float *yr = y + r * h;
		layernorm_row(row, [=](i64 j) { return row[j] + (yr[j] + bias[j]); }, gamma, beta, h, eps, x16 + r * h, prec);
	});
}

// bert_split_heads adds the bias to the fused query/key/value projection
// qkv ([items·seqLen, 3h]) and lays it out head by head, as three
// [items·heads, seqLen, d] blocks (Q, K, V), so that each attention
// product is one strided-batched GEMM: into out in float32 (prec 0), or
// rounded to binary16 (1) or bfloat16 (2) into out16 (out then unused),
// where the attention reads Q, K and V in half precision only, so that
// they never make a float32 round trip. qkv is float32 (in_prec 0) or, as
// a half-precision GEMM leaves it, binary16 (1) or bfloat16 (2); the bias
// is added in float32. One block per token (grid-stride over the
// items·seqLen rows), threads across its values: the token's item and
// position are worked out once a row, a value's head by one 32-bit division
// (a 64-bit one is a long software routine on a GPU, and this runs on every
// value of Q, K and V).
extern "C" GLOBAL void bert_split_heads(const void *qkv, const float *bias, float *out, unsigned short *out16,
	i64 items, i64 seq_len, i64 heads, i64 d, i64 prec, i64 in_prec) {
	i64 rows = items * seq_len;
	int h = (int)(heads * d), dd = (int)d;
	for (i64 r = ctaid(); r < rows; r += nctaid()) {
		i64 b = r / seq_len, p = r - b * seq_len;
		for (int which = 0; which < 3; which++) {
			for (int j = tid(); j < h; j += ntid()) {
				int hd = j / dd, e = j - hd * dd, c = which * h + j;
				i64 at = ((which * items + b) * heads + hd) * seq_len * d + p * d + e;
				float x = load_qkv(qkv, r * 3 * h + c, in_prec) + bias[c];
				if (prec) {
					out16[at] = half_bits(x, prec == 2);
				} else {
					out[at] = x;
				}
			}
		}
	}
}

// bert_merge_heads is the inverse layout for the attention's output: from
// [items·heads, seqLen, d] to [items·seqLen, h]. in is float32 (in_prec 0),
// binary16 (1) or bfloat16 (2); ctx is written in float32 (prec 0) or
// rounded to binary16 (1) or bfloat16 (2), the output projection's operand.
// One block per token, as bert_split_heads.
extern "C" GLOBAL void bert_merge_heads(const void *in, void *ctx, i64 items, i64 seq_len, i64 heads, i64 d, i64 in_prec,
	i64 prec) {
	i64 rows = items * seq_len;
	int h = (int)(heads * d), dd = (int)d;
	for (i64 r = ctaid(); r < rows; r += nctaid()) {
		i64 b = r / seq_len, p = r - b * seq_len;
		for (int j = tid(); j < h; j += ntid()) {
			int hd = j / dd, e = j - hd * dd;
			i64 k = r * h + j;
			float x = load_qkv(in, ((b * heads + hd) * seq_len + p) * d + e, in_prec);
			if (prec) {
				((unsigned short *)ctx)[k] = half_bits(x, prec == 2);
			} else {
				((float *)ctx)[k] = x;
			}
		}
	}
}

// put_prob sets key j's probability p: in row (prec 0), or rounded to
// binary16 (1) or bfloat16 (2) in p16 only, the P·V GEMM's operand, by the
// lane that worked it out.
DEVICE void put_prob(float *row, unsigned short *p16, i64 j, float p, i64 prec) {
	if (prec) {
		p16[j] = half_bits(p, prec == 2);
	} else {
		row[j] = p;
	}
}

// softmax_regs is bert_softmax's row (seq_len ≤ 32·K) for one warp, lane
// l holding keys l, l+32, … in registers. p16 and prec as put_prob's.
template <int K>
INLINE DEVICE void softmax_regs(float *row, i64 seq_len, i64 len, float sc, unsigned short *p16, i64 prec) {
	float v[K];
	float mx = -float_max;
	UNROLL
	for (int t = 0; t < K; t++) {
		i64 j = lane() + 32 * t;
		v[t] = -float_max;
		if (j < seq_len) {
			v[t] = row[j] * sc + (j < len ? 0.0f : -float_max);
			mx = v[t] > mx ? v[t] : mx;
		}
	}
	float m = warp_max(mx);
	double sum = 0.0;
	UNROLL
	for (int t = 0; t < K; t++) {
		if (lane() + 32 * t < seq_len) {
			v[t] = exp_f(v[t] - m);
			sum += v[t];
		}
	}
	float inv = (float)(1.0 / warp_sum(sum));
	UNROLL
	for (int t = 0; t < K; t++) {
		i64 j = lane() + 32 * t;
		if (j < seq_len) {
			put_prob(row, p16, j, v[t] * inv, prec);
		}
	}
}

// bert_softmax replaces each row of the attention scores ([items·heads·
// seqLen, seqLen]: one row per query) by softmax(row·scale + mask), the mask
// adding -FLT_MAX at the keys past the item's length lens[item], which
// makes their weight exactly 0. One warp per row; a row of up to
// 32·row_regs keys in registers (K the power of two that holds it), a
// longer one through memory. With prec 1 or 2 the probabilities go to p16
// (same layout) in binary16 or bfloat16 instead, the P·V GEMM's operand,
// and s is left as scratch (the scores, or past 32·row_regs keys the
// unnormalized exponentials); p16 is unused with prec 0.
extern "C" GLOBAL void bert_softmax(float *s, const int *lens, i64 nrows, i64 seq_len, i64 heads, double scale,
	unsigned short *p16, i64 prec) {
	float sc = (float)scale;
	warp_rows(nrows, [=](i64 r) INLINE {
		float *row = s + r * seq_len;
		unsigned short *p = p16 + r * seq_len;
		i64 len = lens[r / (heads * seq_len)];
		if (seq_len <= 32) {
			softmax_regs<1>(row, seq_len, len, sc, p, prec);
		} else if (seq_len <= 64) {
			softmax_regs<2>(row, seq_len, len, sc, p, prec);
		} else if (seq_len <= 128) {
			softmax_regs<4>(row, seq_len, len, sc, p, prec);
		} else if (seq_len <= 256) {
			softmax_regs<8>(row, seq_len, len, sc, p, prec);
		} else if (seq_len <= 512) {
			softmax_regs<16>(row, seq_len, len, sc, p, prec);
		} else if (seq_len <= 32 * row_regs) {
			softmax_regs<row_regs>(row, seq_len, len, sc, p, prec);
		} else {
			// Each lane reads back only what it wrote: no shuffle orders these.
			float mx = -float_max;
			for (i64 j = lane(); j < seq_len; j += 32) {
				float v = row[j] * sc + (j < len ? 0.0f : -float_max);
				row[j] = v;
				mx = v > mx ? v : mx;
			}
			float m = warp_max(mx);
			double sum = 0.0;
			for (i64 j = lane(); j < seq_len; j += 32) {
				float e = exp_f(row[j] - m);
				row[j] = e;
				sum += e;
			}
			float inv = (float)(1.0 / warp_sum(sum));
			for (i64 j = lane(); j < seq_len; j += 32) {
				put_prob(row, p, j, row[j] * inv, prec);
			}
		}
	});
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
// query row, which only this block reads. blockDim.x must be a multiple of
// 32 of at least d (each of the first d threads accumulates one output
// component) and at most 1024.
//
// Memory: the scores of one tile per block, so a batch needs nothing that
// grows with seqLen² (the unfused path's items·heads·seqLen² floats).
extern "C" GLOBAL void bert_attention(float *qo, const float *k, const float *v, const int *lens, i64 nrows,
	i64 seq_len, i64 heads, i64 d, double scale) {
	SHARED float qs[1024];
	SHARED float ps[1024];
	SHARED double sums[32];
	SHARED float maxes[32];
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
			// block_max's barrier also orders the last tile's reads of ps
			// and sums, and block_sum's the reads of qs and maxes (the last
			// row's), before their next writes.
			float mt = block_max(s, maxes);
			float mn = mt > m ? mt : m;
			float p = j < len ? exp_f(s - mn) : 0.0f;
			ps[tid()] = p;
			double sum = block_sum(p, sums); // its barrier publishes ps
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
// bits h: exact, subnormals, infinities and NaN included. bfloat16 is
// float32's upper half, so a shift.
DEVICE float half_float(unsigned short h, i64 bf16) {
	if (bf16) {
		return __builtin_bit_cast(float, (unsigned)h << 16);
	}
	return f16_float(h);
}

// load_qkv is element i of Q, K or V, or of another operand kept in the
// products' precision: float32 (prec 0), binary16 (1) or bfloat16 (2).
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
// row-major x, in the exact form v·Φ(v) (Hugging Face's "gelu"). x is
// float32 (prec 0), or binary16 (1) or bfloat16 (2) as the half-precision
// GEMM leaves it and the next one reads it: read and written in place in
// its precision, the arithmetic in float32. One block per row, threads
// across it, so a value's bias needs no division.
extern "C" GLOBAL void bert_bias_gelu(void *x, const float *bias, i64 n, i64 width, i64 prec) {
	for (i64 r = ctaid(); r < n; r += nctaid()) {
		for (i64 j = tid(); j < width; j += ntid()) {
			i64 k = r * width + j;
			float v = load_qkv(x, k, prec) + bias[j];
			v = v * phi(v);
			if (prec) {
				((unsigned short *)x)[k] = half_bits(v, prec == 2);
			} else {
				((float *)x)[k] = v;
			}
		}
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
// to nearest even: cvt.rn.f16.f32 or cvt.rn.bf16.f32 (sm_80, PTX 7.0), one
// instruction each, where the rounding written out in integers was a dozen
// branches inlined at every half-precision write. The rounding of
// gpu/cuda.HalfBits, which converts the weights.
DEVICE unsigned short half_bits(float f, i64 bf16) {
	return bf16 ? __nvvm_f2bf16_rn(f) : __nvvm_f2h_rn(f);
}

// bert_l2norm scales each row of y ([n, width]) to unit length, dividing
// by max(‖row‖, 1e-12) as torch.nn.functional.normalize does. One warp per
// row.
extern "C" GLOBAL void bert_l2norm(float *y, i64 n, i64 width) {
	warp_rows(n, [=](i64 i) INLINE {
		float *row = y + i * width;
		double ss = 0.0;
		for (i64 j = lane(); j < width; j += 32) {
			ss += (double)row[j] * (double)row[j];
		}
		double norm = __builtin_sqrt(warp_sum(ss));
		double inv = 1.0 / (norm > 1e-12 ? norm : 1e-12);
		for (i64 j = lane(); j < width; j += 32) {
			row[j] = (float)((double)row[j] * inv);
		}
	});
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
using bertk::bert_attention;
using bertk::bert_attention_tiled;
