/*
 * valuelab's CPU kernel for GAE and the discounted return: one pass over the
 * tokens, no Python loop, no intermediate tensors. Derived in
 * chapters/09_fast_gae.ipynb, section "One pass in C". Built when the package
 * is installed (setup.py: a setuptools extension, optional, so that an
 * install without a C compiler still succeeds and then takes the PyTorch
 * path) into valuelab/_engine/_gae_kernel<EXT_SUFFIX>, and loaded from there by
 * valuelab/_engine/native.py through ctypes (the entry point is valuelab_scan).
 * Plain C99 plus GCC/Clang vector extensions; Python.h is used only, when the
 * build finds it, for an empty module init (see the end), so the file also
 * compiles on its own: cc -O3 -ffp-contract=fast -fPIC -shared -pthread.
 *
 * Portable builds: no -march=native (the built file may run on another
 * CPU). On x86-64 the kernel is compiled once per vector width -- 64, 32
 * and 16 bytes, for AVX-512, AVX2 and the baseline, each with a target
 * attribute -- and the widest the CPU supports runs (see "Vector widths"
 * below); every helper a width's entry function calls is always inlined,
 * so it is compiled for that target too. -DVALUELAB_NO_CLONES builds the
 * 16-byte kernel alone; -DVALUELAB_MAX_VECTOR=32 the 32- and 16-byte ones
 * (the tests build both).
 *
 * For each row, backwards from its end, the mask is cut into runs of valid
 * tokens and runs of masked tokens (the mask bytes are read 64, then 8 at a time).
 * Masked runs get 0 in every output. A valid run [s, e) is scanned with the
 * carry (A, nv) left by the run after it: A the advantage (or return) of the
 * next valid token, nv its value. Carrying over a masked run is exactly
 * running on the compacted sequence (chapter 9, "holes").
 *
 * Inside a run, W consecutive tokens are one vector. With x the TD errors of
 * the W tokens, the in-vector backward scan y_i = sum_{j>=i} c^(j-i) x_j is
 * log2(W) doubling steps, y <- y + c^(2^k) * shift(y, 2^k)
 * (eq-fast-vector-scan); the carry enters as y_i + c^(W-i) A
 * (eq-fast-vector-carry), and the new carry is lane 0. Powers of c are <= 1:
 * nothing overflows or underflows for c in [0, 1].
 *
 * GAE (values != NULL):  A_t = delta_t + c A_{t+1},  delta_t = r_t + gamma nv - v_t,
 *                        adv_t = A_t, ret_t = A_t + v_t, c = gamma * lambda,
 *                        A after the last valid token 0, nv there the bootstrap.
 * Return (values == NULL): G_t = r_t + c G_{t+1}, c = gamma, G after the last
 *                        valid token the bootstrap; written to ret.
 *
 * Large calls (VALUELAB_STREAM_BYTES of outputs or more, on x86-64) write
 * their outputs with non-temporal stores, a cache line at a time: a run's
 * last tokens are done one by one until the vector blocks start on a line.
 */
#if defined(__has_include)
#if __has_include(<Python.h>) /* setup.py's build: the include path has Python's headers */
#define PY_SSIZE_T_CLEAN
#include <Python.h> /* first, as Python asks; used only by PyInit__gae_kernel at the end */
#define VALUELAB_PYTHON_MODULE 1
#endif
#endif
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define STR_(...) #__VA_ARGS__
#define STR(...) STR_(__VA_ARGS__)

/*
 * Vector widths. A vector holds W tokens; each width has a kernel of its own (DEFINE_KERNEL below), since a
 * 64-byte vector compiled for a 32-byte machine is two registers whose lane shifts cross between them (7 to 11
 * times the 32-byte kernel's time per token, both built for AVX2 and timed on one Zen 4 core by
 * tools/kernel_widths.py --before 0464cc9). On x86-64, with GCC or Clang, three are
 * compiled -- 64-byte vectors for AVX-512 (16 float32 or 8 float64 tokens), 32-byte ones for AVX2 with FMA
 * (8 or 4) and 16-byte ones for the baseline, SSE2 (4 or 2) -- each with a target attribute, and the widest
 * the CPU and the OS support is picked once, when the library loads (pick_vector_bytes). Elsewhere (ARM's
 * NEON, ...) the 16-byte kernel alone. -DVALUELAB_NO_CLONES builds the 16-byte kernel alone;
 * -DVALUELAB_MAX_VECTOR=32 leaves the 64-byte one out (the tests build both).
 */
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__)) && !defined(VALUELAB_NO_CLONES)
#define VALUELAB_CLONED 1
#ifndef VALUELAB_MAX_VECTOR
#define VALUELAB_MAX_VECTOR 64
#endif
#define ON_64 __attribute__((target("avx512f,avx512vl,fma")))
#define ON_32 __attribute__((target("avx2,fma")))
#else
#undef VALUELAB_MAX_VECTOR
#define VALUELAB_MAX_VECTOR 16
#endif
#define ON_16 /* the baseline */

typedef float f32x16 __attribute__((vector_size(64)));
typedef float f32x8 __attribute__((vector_size(32)));
typedef float f32x4 __attribute__((vector_size(16)));
typedef double f64x8 __attribute__((vector_size(64)));
typedef double f64x4 __attribute__((vector_size(32)));
typedef double f64x2 __attribute__((vector_size(16)));
typedef int32_t i32x16 __attribute__((vector_size(64)));
typedef int32_t i32x8 __attribute__((vector_size(32)));
typedef int32_t i32x4 __attribute__((vector_size(16)));
typedef int64_t i64x8 __attribute__((vector_size(64)));
typedef int64_t i64x4 __attribute__((vector_size(32)));
typedef int64_t i64x2 __attribute__((vector_size(16)));

#define ALL_VALID 0x0101010101010101ULL /* 8 bool bytes, all true */
/* A call that writes at least this many bytes of outputs streams them past the caches (non-temporal stores):
   its outputs could not stay cached anyway, and streaming spares the read-for-ownership of every output line and
   the eviction of the inputs (chapter 9, "Large batches"). -DVALUELAB_STREAM_BYTES=0 streams every call (a test
   build does, to check that both stores give the same bits). */
#ifndef VALUELAB_STREAM_BYTES
#define VALUELAB_STREAM_BYTES (16LL << 20)
#endif
typedef uint64_t vu64 __attribute__((vector_size(64)));
/* The 64 bytes at p are 8 copies of word (the mask is read a cache line at a time, then 8 bytes, then 1). */
INLINE int all64(const uint8_t *p, uint64_t word) {
    vu64 w;
    memcpy(&w, p, 64);
    w ^= word;
    uint64_t o = 0;
    for (int i = 0; i < 8; ++i) o |= w[i];
    return o == 0;
}

/* Start of the valid run that ends at e - 1 (m[e - 1] is true). */
INLINE int64_t valid_run_start(const uint8_t *m, int64_t e) {
    int64_t s = e;
    while (s >= 64 && all64(m + s - 64, ALL_VALID)) s -= 64;
    while (s >= 8) {
        uint64_t w;
        memcpy(&w, m + s - 8, 8);
        if (w != ALL_VALID) break;
        s -= 8;
    }
    while (s > 0 && m[s - 1]) --s;
    return s;
}

/* Start of the masked run that ends at e - 1 (m[e - 1] is false). */
INLINE int64_t masked_run_start(const uint8_t *m, int64_t e) {
    int64_t s = e;
    while (s >= 64 && all64(m + s - 64, 0)) s -= 64;
    while (s >= 8) {
        uint64_t w;
        memcpy(&w, m + s - 8, 8);
        if (w != 0) break;
        s -= 8;
    }
    while (s > 0 && !m[s - 1]) --s;
    return s;
}

/* The lanes k .. k + W - 1 of (x, z) concatenated: x shifted down by k lanes, z's first lanes filling in. */
#if defined(__clang__)
#define SH16(x, z, k)                                                                                 \
    __builtin_shufflevector(x, z, 0 + k, 1 + k, 2 + k, 3 + k, 4 + k, 5 + k, 6 + k, 7 + k, 8 + k, 9 + k, \
                            10 + k, 11 + k, 12 + k, 13 + k, 14 + k, 15 + k)
#define SH8(x, z, k) __builtin_shufflevector(x, z, 0 + k, 1 + k, 2 + k, 3 + k, 4 + k, 5 + k, 6 + k, 7 + k)
#define SH4(x, z, k) __builtin_shufflevector(x, z, 0 + k, 1 + k, 2 + k, 3 + k)
#define SH2(x, z, k) __builtin_shufflevector(x, z, 0 + k, 1 + k)
#define SH16F SH16
#define SH8F SH8
#define SH4F SH4
#define SH8D SH8
#define SH4D SH4
#define SH2D SH2
#else
#define SH16F(x, z, k) \
    __builtin_shuffle(x, z, (i32x16){0 + k, 1 + k, 2 + k, 3 + k, 4 + k, 5 + k, 6 + k, 7 + k, \
                                     8 + k, 9 + k, 10 + k, 11 + k, 12 + k, 13 + k, 14 + k, 15 + k})
#define SH8F(x, z, k) __builtin_shuffle(x, z, (i32x8){0 + k, 1 + k, 2 + k, 3 + k, 4 + k, 5 + k, 6 + k, 7 + k})
#define SH4F(x, z, k) __builtin_shuffle(x, z, (i32x4){0 + k, 1 + k, 2 + k, 3 + k})
#define SH8D(x, z, k) __builtin_shuffle(x, z, (i64x8){0 + k, 1 + k, 2 + k, 3 + k, 4 + k, 5 + k, 6 + k, 7 + k})
#define SH4D(x, z, k) __builtin_shuffle(x, z, (i64x4){0 + k, 1 + k, 2 + k, 3 + k})
#define SH2D(x, z, k) __builtin_shuffle(x, z, (i64x2){0 + k, 1 + k})
#endif
/* y_i <- y_i + c^k y_{i+k} (0 past the last lane), for k = 1, 2, 4, ... < W: eq-fast-vector-scan */
#define SCAN_STEP(x, z, cp, q, SH) x = x + cp[q] * SH(x, z, (1 << q))
#define SCAN2(x, z, cp, SH) SCAN_STEP(x, z, cp, 0, SH)
#define SCAN4(x, z, cp, SH) do { SCAN2(x, z, cp, SH); SCAN_STEP(x, z, cp, 1, SH); } while (0)
#define SCAN8(x, z, cp, SH) do { SCAN4(x, z, cp, SH); SCAN_STEP(x, z, cp, 2, SH); } while (0)
#define SCAN16(x, z, cp, SH) do { SCAN8(x, z, cp, SH); SCAN_STEP(x, z, cp, 3, SH); } while (0)

#define DEFINE_KERNEL(NAME, T_, V_, W, SCAN, SH, NTSTORE, ON)                                                          \
    /* One token of the recursion, t, whose next valid value is vnext; returns its A. Its return is   \
       added to *tail (the finiteness test: see NAME##_rows). */                                      \
    INLINE ON T_ NAME##_step(const T_ *r, const T_ *v, T_ *adv, T_ *ret, int64_t t, T_ vnext,            \
                                 T_ gamma, T_ c, T_ A, T_ *tail) {                                    \
        if (v) {                                                                                      \
            A = (r[t] + gamma * vnext - v[t]) + c * A;                                                \
            adv[t] = A;                                                                               \
            ret[t] = A + v[t];                                                                        \
        } else {                                                                                      \
            A = r[t] + c * A;                                                                         \
            ret[t] = A;                                                                               \
        }                                                                                             \
        *tail += ret[t]; /* a non-finite advantage makes its return non-finite (v[t] is finite) */    \
        return A;                                                                                     \
    }                                                                                                 \
    /* Store one vector: a plain store, or (nt) a non-temporal one (dst aligned to the vector). */          \
    INLINE ON void NAME##_put(T_ *dst, const V_ *x, int nt) {                                        \
        if (nt)                                                                                       \
            NTSTORE(dst, *x);                                                                         \
        else                                                                                          \
            memcpy(dst, x, sizeof(V_));                                                               \
    }                                                                                                 \
    /* One valid run [s, e) of one row; *A_io and *nv_io carry in and out. */                         \
    INLINE ON void NAME##_run(const T_ *r, const T_ *v, T_ *adv, T_ *ret, int64_t s, int64_t e,          \
                           T_ gamma, T_ c, const T_ *cp, const V_ *Pp, T_ PW, T_ *A_io, T_ *nv_io,    \
                           V_ *acc, int nt) { /* vectors by pointer: no vector argument in a clone's ABI */   \
        const V_ P = *Pp;                                                                             \
        int64_t t = e - 1; /* the run's last token: its next value is the carried nv */               \
        T_ tail = 0; /* the sum of the returns of the tokens done one by one */                        \
        T_ A = NAME##_step(r, v, adv, ret, t, *nv_io, gamma, c, *A_io, &tail);                        \
        while (nt && t > s && ((uintptr_t)(ret + t) & 63)) { /* streamed blocks start on a cache line */ \
            --t;                                                                                      \
            A = NAME##_step(r, v, adv, ret, t, v ? v[t + 1] : (T_)0, gamma, c, A, &tail);             \
        }                                                                                             \
        const V_ zero = {0};                                                                          \
        V_ sum = zero; /* of the returns written: finite iff they are (or the sum overflows) */ \
        for (; t - 2 * W >= s; t -= 2 * W) { /* two vectors: p .. p + W - 1 (lo), p + W .. (hi) */    \
            int64_t p = t - 2 * W;                                                                    \
            V_ xl, xh, vl = zero, vh = zero, vnl, vnh; /* vl, vh: read only when v */                 \
            memcpy(&xl, r + p, sizeof(V_));                                                           \
            memcpy(&xh, r + p + W, sizeof(V_));                                                       \
            if (v) {                                                                                  \
                memcpy(&vl, v + p, sizeof(V_));                                                       \
                memcpy(&vh, v + p + W, sizeof(V_));                                                   \
                memcpy(&vnl, v + p + 1, sizeof(V_));                                                  \
                memcpy(&vnh, v + p + W + 1, sizeof(V_));                                              \
                xl = (xl + gamma * vnl) - vl;                                                         \
                xh = (xh + gamma * vnh) - vh;                                                         \
            }                                                                                         \
            SCAN(xl, zero, cp, SH);                                                                       \
            SCAN(xh, zero, cp, SH);                                                                       \
            xl = xl + P * xh[0]; /* lo's local solution now runs to the end of hi */                  \
            xh = xh + P * A;                                                                          \
            xl = xl + (P * PW) * A; /* c^(2W - i) A */                                                \
            A = xl[0];                                                                                \
            if (v) {                                                                                  \
                NAME##_put(adv + p, &xl, nt);                                                         \
                NAME##_put(adv + p + W, &xh, nt);                                                     \
                xl = xl + vl;                                                                         \
                xh = xh + vh;                                                                         \
            }                                                                                         \
            NAME##_put(ret + p, &xl, nt);                                                             \
            NAME##_put(ret + p + W, &xh, nt);                                                         \
            sum = sum + (xl + xh);                                                                    \
        }                                                                                             \
        for (; t - W >= s; t -= W) { /* tokens p .. p + W - 1, all followed by a valid token */       \
            int64_t p = t - W;                                                                        \
            V_ x, vv = zero, vn; /* vv: read only when v (zero: no maybe-uninitialized warning) */    \
            memcpy(&x, r + p, sizeof(V_));                                                            \
            if (v) {                                                                                  \
                memcpy(&vv, v + p, sizeof(V_));                                                       \
                memcpy(&vn, v + p + 1, sizeof(V_));                                                   \
                x = (x + gamma * vn) - vv; /* TD errors */                                            \
            }                                                                                         \
            SCAN(x, zero, cp, SH);                                                                        \
            x = x + P * A; /* eq-fast-vector-carry */                                                 \
            A = x[0];                                                                                 \
            if (v) {                                                                                  \
                NAME##_put(adv + p, &x, nt);                                                          \
                x = x + vv;                                                                           \
            }                                                                                         \
            NAME##_put(ret + p, &x, nt);                                                              \
            sum = sum + x;                                                                            \
        }                                                                                             \
        for (--t; t >= s; --t) /* the run's first tokens, fewer than W */                             \
            A = NAME##_step(r, v, adv, ret, t, v ? v[t + 1] : (T_)0, gamma, c, A, &tail);             \
        sum[0] += tail;                                                                               \
        *acc = *acc + sum;                                                                            \
        *A_io = A;                                                                                    \
        if (v) *nv_io = v[s];                                                                         \
    }                                                                                                 \
    /* *acc += x[s .. e - 1], a vector at a time (the inputs under a masked run). */                  \
    INLINE ON void NAME##_add(const T_ *x, int64_t s, int64_t e, V_ *acc) {                              \
        V_ sum = {0}, y;                                                                              \
        for (; s + W <= e; s += W) {                                                                  \
            memcpy(&y, x + s, sizeof(V_));                                                            \
            sum = sum + y;                                                                            \
        }                                                                                             \
        for (; s < e; ++s) sum[0] += x[s];                                                            \
        *acc = *acc + sum;                                                                            \
    }                                                                                                 \
    /* Rows b0 .. b1 - 1. Returns 1 if the sum of the returns written and of the inputs (r, v) under   \
       masked runs is finite. That covers every input: at a valid token a non-finite r_t or v_t makes   \
       ret_t non-finite (ret_t = (r_t + gamma nv - v_t + c A) + v_t: an infinite v_t leaves inf - inf), \
       so the valid tokens' inputs need no sum of their own. nt: stream the outputs (VALUELAB_STREAM_BYTES), \
       where adv and ret share their offset within a cache line. One per vector width, compiled for  \
       its target (ON); everything above is inlined into it. */                                                      \
    ON static int NAME##_rows(const T_ *r, const T_ *v, const uint8_t *m, const T_ *boot,             \
                              T_ *adv, T_ *ret, int64_t T, T_ gamma, T_ c, int64_t b0, int64_t b1, int nt) { \
        V_ acc = {0};                                                                                 \
        T_ cp[4]; /* c, c^2, c^4, c^8 */                                                              \
        cp[0] = c;                                                                                    \
        for (int i = 1; i < 4; ++i) cp[i] = cp[i - 1] * cp[i - 1];                                    \
        V_ P; /* P_i = c^(W - i) */                                                                   \
        T_ q = 1;                                                                                     \
        for (int i = W - 1; i >= 0; --i) {                                                            \
            q *= c;                                                                                   \
            P[i] = q;                                                                                 \
        }                                                                                             \
        T_ PW = q; /* c^W */                                                                          \
        nt = nt && (!v || (((uintptr_t)adv - (uintptr_t)ret) & 63) == 0);                             \
        for (int64_t b = b0; b < b1; ++b) {                                                           \
            const T_ *rb = r + b * T;                                                                 \
            const T_ *vb = v ? v + b * T : NULL;                                                      \
            T_ *ab = v ? adv + b * T : NULL;                                                          \
            T_ *gb = ret + b * T;                                                                     \
            T_ boot_b = boot ? boot[b] : (T_)0;                                                       \
            T_ A = v ? (T_)0 : boot_b, nv = boot_b;                                                   \
            if (!m) {                                                                                 \
                NAME##_run(rb, vb, ab, gb, 0, T, gamma, c, cp, &P, PW, &A, &nv, &acc, nt);                \
                continue;                                                                             \
            }                                                                                         \
            const uint8_t *mb = m + b * T;                                                            \
            for (int64_t e = T, s; e > 0; e = s) {                                                    \
                if (mb[e - 1]) {                                                                      \
                    s = valid_run_start(mb, e);                                                       \
                    NAME##_run(rb, vb, ab, gb, s, e, gamma, c, cp, &P, PW, &A, &nv, &acc, nt);            \
                } else {                                                                              \
                    s = masked_run_start(mb, e);                                                      \
                    if (v) memset(ab + s, 0, (size_t)(e - s) * sizeof(T_));                           \
                    memset(gb + s, 0, (size_t)(e - s) * sizeof(T_));                                  \
                    NAME##_add(rb, s, e, &acc);                                                       \
                    if (v) NAME##_add(vb, s, e, &acc);                                                \
                }                                                                                     \
            }                                                                                         \
        }                                                                                             \
        if (nt) STORE_FENCE(); /* the streamed stores are visible before the job counts as done */ \
        T_ total = 0;                                                                                 \
        for (int i = 0; i < W; ++i) total += acc[i];                                                  \
        return isfinite(total) ? 1 : 0;                                                               \
    }

/* Non-temporal stores of a whole vector (the streamed calls: VALUELAB_STREAM_BYTES), on x86-64; plain ones
   elsewhere, where nt is never set. Each kernel uses its own width's instruction, inside its target. */
#if defined(__x86_64__)
#include <immintrin.h>
#define NT16F(p, x) _mm_stream_ps(p, (__m128)(x))
#define NT8D_2(p, x) _mm_stream_pd(p, (__m128d)(x))
#define NT8F(p, x) _mm256_stream_ps(p, (__m256)(x))
#define NT4D(p, x) _mm256_stream_pd(p, (__m256d)(x))
#define NT16F_64(p, x) _mm512_stream_ps(p, (__m512)(x))
#define NT8D_64(p, x) _mm512_stream_pd(p, (__m512d)(x))
#define CAN_STREAM 1
#define STORE_FENCE() _mm_sfence()
#else
#define NT_PLAIN(p, x) memcpy(p, &(x), sizeof(x))
#define CAN_STREAM 0
#define STORE_FENCE() ((void)0)
#endif

#if VALUELAB_MAX_VECTOR >= 64
/* AVX-512's lane shifts with zero fill are one valignd / valignq each (the generic SH16F / SH8D compile to
   two-source permutes: about 8 % more time per float32 token on a Zen 4 core) */
#define SH16F_64(x, z, k) ((f32x16)_mm512_alignr_epi32((__m512i)(z), (__m512i)(x), k))
#define SH8D_64(x, z, k) ((f64x8)_mm512_alignr_epi64((__m512i)(z), (__m512i)(x), k))
DEFINE_KERNEL(scan_f32x16, float, f32x16, 16, SCAN16, SH16F_64, NT16F_64, ON_64)
DEFINE_KERNEL(scan_f64x8, double, f64x8, 8, SCAN8, SH8D_64, NT8D_64, ON_64)
#endif
#if VALUELAB_MAX_VECTOR >= 32
DEFINE_KERNEL(scan_f32x8, float, f32x8, 8, SCAN8, SH8F, NT8F, ON_32)
DEFINE_KERNEL(scan_f64x4, double, f64x4, 4, SCAN4, SH4D, NT4D, ON_32)
#endif
#if defined(__x86_64__)
DEFINE_KERNEL(scan_f32x4, float, f32x4, 4, SCAN4, SH4F, NT16F, ON_16)
DEFINE_KERNEL(scan_f64x2, double, f64x2, 2, SCAN2, SH2D, NT8D_2, ON_16)
#else
DEFINE_KERNEL(scan_f32x4, float, f32x4, 4, SCAN4, SH4F, NT_PLAIN, ON_16)
DEFINE_KERNEL(scan_f64x2, double, f64x2, 2, SCAN2, SH2D, NT_PLAIN, ON_16)
#endif

/* The vector width valuelab_scan runs, in bytes: the widest kernel built that this CPU and its OS support. */
static int vector_bytes = 16;
__attribute__((constructor)) static void pick_vector_bytes(void) {
#if VALUELAB_MAX_VECTOR >= 32
    __builtin_cpu_init(); /* the checks below include the OS's support of the registers (XCR0) */
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) vector_bytes = 32;
#endif
#if VALUELAB_MAX_VECTOR >= 64
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma"))
        vector_bytes = 64;
#endif
}

typedef struct {
    const void *r, *v;
    const uint8_t *m;
    const void *boot;
    void *adv, *ret;
    int64_t T, b0, b1;
    double gamma, c;
    int f64;
    int nt;     /* stream the outputs past the caches */
    int finite; /* out */
} job_t;

#define RUN_ROWS(F32, F64)                                                                            \
    (j->f64 ? F64(j->r, j->v, j->m, j->boot, j->adv, j->ret, j->T, j->gamma, j->c, j->b0, j->b1, j->nt)   \
            : F32(j->r, j->v, j->m, j->boot, j->adv, j->ret, j->T, (float)j->gamma, (float)j->c, j->b0, j->b1, j->nt))
static void *run_job(void *arg) {
    job_t *j = (job_t *)arg;
#if VALUELAB_MAX_VECTOR >= 64
    if (vector_bytes == 64) {
        j->finite = RUN_ROWS(scan_f32x16_rows, scan_f64x8_rows);
        return NULL;
    }
#endif
#if VALUELAB_MAX_VECTOR >= 32
    if (vector_bytes == 32) {
        j->finite = RUN_ROWS(scan_f32x8_rows, scan_f64x4_rows);
        return NULL;
    }
#endif
    j->finite = RUN_ROWS(scan_f32x4_rows, scan_f64x2_rows);
    return NULL;
}

#define MAX_THREADS 64
#define MAX_CHUNKS 64 /* of rows, per call */

/*
 * Without OpenMP, or in a forked child (see below), a persistent pool of
 * worker threads that *help*. Starting a thread costs
 * tens of microseconds to a millisecond on a small VM, and waking a sleeping
 * one tens to a hundred -- as much as the whole scan of a 64 x 4096 batch.
 * So the rows are cut into chunks, and the caller's thread starts on them
 * at once, claiming one chunk after another from a shared counter; a worker
 * that is awake (spinning after a previous call: back-to-back calls) claims
 * chunks too, and one that wakes late finds none left. A call is never
 * slower than on one thread by more than the wake-up call itself.
 *
 * - The counter is one 64-bit word: (generation << 32) | (chunks << 16) |
 *   next. A claim is a compare-and-swap that succeeds only within the
 *   current generation (one per call), so a late worker can never take a
 *   chunk of another call; the caller returns only when every chunk of its
 *   call is done (pool_done counts them), so its jobs outlive every claim.
 * - One call at a time uses the pool: a caller that finds it busy (another
 *   Python thread is in valuelab_scan) runs all its rows itself.
 * - Worker id helps only when id < the call's thread count.
 * - Fork: the child has none of the parent's threads; pthread_atfork resets
 *   the pool there, and the child's first call starts its own workers.
 * - A worker that cannot be started is simply not there.
 * Rows are independent, so the result does not depend on who scanned them.
 */
static pthread_mutex_t pool_busy = PTHREAD_MUTEX_INITIALIZER; /* held by the one calling thread */
static pthread_mutex_t pool_mu = PTHREAD_MUTEX_INITIALIZER;   /* guards the condition variables */
static pthread_cond_t pool_wake = PTHREAD_COND_INITIALIZER;
static pthread_cond_t pool_finished = PTHREAD_COND_INITIALIZER;
static int pool_size;                       /* workers started (ids 1 .. pool_size) */
static job_t *pool_jobs;                    /* this call's chunks */
static int pool_helpers;                    /* this call's thread count - 1 */
static _Atomic unsigned long long pool_state; /* generation, chunk count, next chunk */
static _Atomic int pool_done;               /* chunks of this call finished */
static _Atomic int pool_sleepers;           /* workers asleep on pool_wake */
static int pool_fork_handler;               /* pthread_atfork registered */

#define SPIN 4000 /* polls before a worker sleeps, or the caller waits: tens of microseconds */
#define GEN(s) ((unsigned)((s) >> 32))
#define CHUNKS(s) ((int)(((s) >> 16) & 0xFFFF))
#define NEXT(s) ((int)((s)&0xFFFF))

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

#if defined(_OPENMP)
/*
 * Built with -fopenmp (setup.py's first try), a call's chunks run on OpenMP
 * threads instead. The library needs libgomp.so.1; PyTorch's Linux wheels
 * ship and load a libgomp.so.1 of their own before valuelab loads this file,
 * so the dynamic linker binds this one to the same runtime: the kernel then
 * runs on PyTorch's intra-op threads -- the ones that spin after each op
 * (GOMP_SPINCOUNT) and would otherwise compete with a pool of our own for
 * the cores -- and they join a call at once. libgomp's threads do not survive
 * fork() (a forked child that enters a parallel region after its parent used
 * one waits forever, PyTorch's own ops included), so a forked child uses the
 * pthread pool below: in_forked_child is set by the atfork handler, which a
 * constructor registers when the library loads.
 */
#include <omp.h>
static volatile int in_forked_child;
#endif

static void pool_after_fork_in_child(void) {
#if defined(_OPENMP)
    in_forked_child = 1;
#endif
    pthread_mutex_t m = PTHREAD_MUTEX_INITIALIZER;
    pthread_cond_t cv = PTHREAD_COND_INITIALIZER;
    pool_busy = m;
    pool_mu = m;
    pool_wake = cv;
    pool_finished = cv;
    pool_size = 0;
    pool_jobs = NULL;
    atomic_store(&pool_state, 0);
    atomic_store(&pool_done, 0);
    atomic_store(&pool_sleepers, 0);
}

/* Claim and run chunks of generation gen until none is left; returns how many were run here. */
static int pool_claim(unsigned gen) {
    int ran = 0;
    unsigned long long s = atomic_load_explicit(&pool_state, memory_order_acquire);
    while (GEN(s) == gen && NEXT(s) < CHUNKS(s)) {
        if (atomic_compare_exchange_weak_explicit(&pool_state, &s, s + 1, memory_order_acq_rel,
                                                  memory_order_acquire)) {
            run_job(&pool_jobs[NEXT(s)]);
            ++ran;
            if (atomic_fetch_add_explicit(&pool_done, 1, memory_order_acq_rel) + 1 == CHUNKS(s)) {
                pthread_mutex_lock(&pool_mu);
                pthread_cond_signal(&pool_finished);
                pthread_mutex_unlock(&pool_mu);
            }
            s = atomic_load_explicit(&pool_state, memory_order_acquire);
        }
    }
    return ran;
}

static void *pool_worker(void *arg) {
    int id = (int)(intptr_t)arg;
    unsigned seen = GEN(atomic_load_explicit(&pool_state, memory_order_acquire));
    for (;;) {
        unsigned g = seen;
        for (int k = 0; k < SPIN && (g = GEN(atomic_load_explicit(&pool_state, memory_order_acquire))) == seen; ++k)
            cpu_relax();
        if (g == seen) {
            pthread_mutex_lock(&pool_mu);
            atomic_fetch_add(&pool_sleepers, 1);
            while ((g = GEN(atomic_load(&pool_state))) == seen) /* seq_cst: pairs with pool_run's store */
                pthread_cond_wait(&pool_wake, &pool_mu);
            atomic_fetch_sub(&pool_sleepers, 1);
            pthread_mutex_unlock(&pool_mu);
        }
        seen = g;
        if (id <= pool_helpers) pool_claim(g); /* pool_helpers is this call's: written before the generation */
    }
    return NULL;
}

/* The fork handler, registered when the library loads (before any thread of ours or of OpenMP's exists). */
__attribute__((constructor)) static void pool_register_fork_handler(void) {
    pool_fork_handler = pthread_atfork(NULL, NULL, pool_after_fork_in_child) == 0;
}

/* Start workers until there are `want` (or starting one fails). Called with pool_busy held. */
static void pool_grow(int want) {
    if (!pool_fork_handler) /* registration failed at load: retry, as before any worker starts */
        pool_fork_handler = pthread_atfork(NULL, NULL, pool_after_fork_in_child) == 0;
    while (pool_size < want && pool_size + 1 < MAX_THREADS) {
        pthread_t th;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        pthread_attr_setstacksize(&attr, 1 << 18); /* the kernel needs a few KiB of stack */
        int ok = pthread_create(&th, &attr, pool_worker, (void *)(intptr_t)(pool_size + 1)) == 0;
        pthread_attr_destroy(&attr);
        if (!ok) break;
        ++pool_size;
    }
}

/* Run the n chunks jobs[0 .. n-1] with up to `helpers` workers. Called with pool_busy held. */
static void pool_run(job_t *jobs, int n, int helpers) {
    unsigned gen = GEN(atomic_load_explicit(&pool_state, memory_order_relaxed)) + 1;
    pool_jobs = jobs;
    pool_helpers = helpers;
    atomic_store_explicit(&pool_done, 0, memory_order_relaxed);
    /* seq_cst store, then seq_cst load of the sleepers: a worker going to sleep either sees this
       generation or is counted here (and then waits on pool_wake under pool_mu before we broadcast) */
    atomic_store(&pool_state, ((unsigned long long)gen << 32) | ((unsigned long long)n << 16));
    if (atomic_load(&pool_sleepers) > 0) { /* a syscall only when some worker sleeps */
        pthread_mutex_lock(&pool_mu);
        pthread_cond_broadcast(&pool_wake);
        pthread_mutex_unlock(&pool_mu);
    }
    pool_claim(gen);
    for (int k = 0; k < SPIN && atomic_load_explicit(&pool_done, memory_order_acquire) < n; ++k) cpu_relax();
    if (atomic_load_explicit(&pool_done, memory_order_acquire) < n) {
        pthread_mutex_lock(&pool_mu);
        while (atomic_load_explicit(&pool_done, memory_order_acquire) < n) pthread_cond_wait(&pool_finished, &pool_mu);
        pthread_mutex_unlock(&pool_mu);
    }
}

/*
 * The entry point. r, v (or NULL), adv (unused when v is NULL), ret: (B, T)
 * row-major float32 (f64 = 0) or float64 (f64 = 1); m: (B, T) bytes or NULL
 * (all valid), a token valid iff its byte is nonzero (so a bool tensor
 * holding bytes other than 0/1 reads as byte != 0); boot: (B,) or NULL (0).
 * gamma and c are rounded to the dtype here. Rows are shared by the
 * caller's thread and up to nthreads - 1 pool workers (above). Returns 1 if
 * every input entry (r and v, masked or not) and every return written is
 * finite -- tested as one sum, of the returns and of the masked tokens' inputs
 * (see NAME##_rows) -- else 0: then an entry is NaN or infinite, a return
 * overflowed, or only the sum overflowed; the caller checks entry by entry.
 * A call writing VALUELAB_STREAM_BYTES or more streams its outputs.
 */
int valuelab_scan(const void *r, const void *v, const uint8_t *m, const void *boot, void *adv, void *ret,
                  int64_t B, int64_t T, double gamma, double c, int f64, int nthreads) {
    if (B <= 0 || T <= 0) return 1;
    int nt = CAN_STREAM && B * T * (f64 ? 8 : 4) * (v ? 2 : 1) >= (int64_t)VALUELAB_STREAM_BYTES; /* stream the outputs */
    if (nthreads > MAX_THREADS) nthreads = MAX_THREADS;
    if (nthreads > B) nthreads = (int)B;
    if (nthreads < 1) nthreads = 1;
    if (nthreads == 1 || pthread_mutex_trylock(&pool_busy) != 0) { /* alone, or the pool is busy */
        job_t all = {r, v, m, boot, adv, ret, T, 0, B, gamma, c, f64, nt, 0};
        run_job(&all);
        return all.finite;
    }
    /* chunks of rows: a few per thread, so that a worker that joins late still takes a share */
    int n = B < MAX_CHUNKS ? (int)B : MAX_CHUNKS;
    int64_t per = (B + n - 1) / n;
    job_t jobs[MAX_CHUNKS];
    n = 0;
    for (int64_t b0 = 0; b0 < B; b0 += per) {
        job_t j = {r, v, m, boot, adv, ret, T, b0, b0 + per < B ? b0 + per : B, gamma, c, f64, nt, 0};
        jobs[n++] = j;
    }
#if defined(_OPENMP)
    if (!in_forked_child) { /* contiguous shares: the region's end waits for every thread anyway */
#pragma omp parallel for num_threads(nthreads) schedule(static)
        for (int i = 0; i < n; ++i) run_job(&jobs[i]);
    } else
#endif
    {
        pool_grow(nthreads - 1);
        pool_run(jobs, n, nthreads - 1);
    }
    pthread_mutex_unlock(&pool_busy);
    int finite = 1;
    for (int i = 0; i < n; ++i) finite &= jobs[i].finite;
    return finite;
}

/* The kernel valuelab_scan runs on this CPU (pick_vector_bytes), for python -m valuelab info. */
const char *valuelab_target(void) {
    if (vector_bytes == 64) return "64-byte vectors (AVX-512)";
    if (vector_bytes == 32) return "32-byte vectors (AVX2)";
#if defined(VALUELAB_CLONED)
    return "16-byte vectors (baseline)";
#else
    return "16-byte vectors (single target)";
#endif
}

/* The width of the vectors valuelab_scan runs, in bytes (W = this / the dtype's size). */
int valuelab_vector_bytes(void) { return vector_bytes; }

/* Whose threads share a call's rows, for python -m valuelab info. */
const char *valuelab_threading(void) {
#if defined(_OPENMP)
    return in_forked_child ? "own pthread pool (a forked child: OpenMP's threads did not survive fork)"
                           : "OpenMP (the runtime PyTorch loaded, where it is libgomp.so.1)";
#else
    return "own pthread pool";
#endif
}

/* The SHA-256 of this file as setup.py built it (the loader refuses a build of another version). */
#ifndef VALUELAB_SOURCE_SHA256
#define VALUELAB_SOURCE_SHA256 "" /* built outside setup.py: unknown */
#endif
const char *valuelab_source_sha256(void) { return VALUELAB_SOURCE_SHA256; }

#ifdef VALUELAB_PYTHON_MODULE
/* An empty module, so that the built file is a valid extension module (importing it does nothing);
   valuelab/_engine/native.py never imports it: it loads the file with ctypes and calls valuelab_scan. */
static struct PyModuleDef gae_kernel_module = {
    PyModuleDef_HEAD_INIT, "valuelab._engine._gae_kernel",
    "valuelab's CPU kernel (valuelab/_engine/_gae_kernel.c); called through ctypes by valuelab._engine.native.", -1, NULL,
    NULL, NULL, NULL, NULL};
PyMODINIT_FUNC PyInit__gae_kernel(void) { return PyModule_Create(&gae_kernel_module); }
#endif
