/* dispatch.c - picks the kernel table once per process from CPUID (capped
 * by TINYLOOP_ISA) and routes the public entry points through it.
 *
 * One table per level is built at init: scalar, then AVX2 on top of it,
 * then AVX-512 on top of that, so a level only overrides what it has. The
 * active table is an atomic pointer; tl_kernels_set_isa swaps it (tests). */
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "quants_impl.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#ifdef __linux__
#include <sys/syscall.h>
#include <unistd.h>
#endif

static tl_kernel_table tables[4];
static int cpu_level; /* best level the CPU (and OS) supports */
static int env_cap = TL_ISA_AMX;
static _Atomic(const tl_kernel_table *) active;
static atomic_int active_level;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static int detect_cpu(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_cpu_init();
    if (!(__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))) return TL_ISA_SCALAR;
    /* F16C has no __builtin_cpu_supports name in older compilers; every
     * AVX2 CPU shipped has it. */
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq"))
        return TL_ISA_AVX512;
    return TL_ISA_AVX2;
#else
    return TL_ISA_SCALAR;
#endif
}

static int has_vnni(void) {
#if defined(__x86_64__) || defined(__i386__)
    /* the VNNI kernels also use BMI2 (every VNNI CPU has it) */
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("bmi2");
#else
    return 0;
#endif
}

static int has_bf16(void) {
#if defined(__x86_64__) || defined(__i386__)
    /* CPUID leaf 7 sub-leaf 1, EAX bit 5 (no __builtin_cpu_supports name in
     * older compilers); the OS's AVX-512 state is implied by avx512f. */
    unsigned a, b, c, d;
    if (!__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
    return (a >> 5) & 1;
#else
    return 0;
#endif
}

/* CPUID leaf 7's EDX: the AMX bits (22 AMX-BF16, 24 AMX-TILE, 25 AMX-INT8). */
static unsigned amx_edx(void) {
#if defined(__x86_64__) || defined(__i386__)
    unsigned a, b, c, d;
    return __get_cpuid_count(7, 0, &a, &b, &c, &d) ? d : 0;
#else
    return 0;
#endif
}

/* AMX-TILE and AMX-INT8, and the OS's leave to use them: Linux hands a
 * process the 8 KiB of tile state only on request (arch_prctl
 * ARCH_REQ_XCOMP_PERM for XTILEDATA, 5.16 on); a kernel without it, or a
 * VM that hides the state, refuses. */
static int has_amx(void) {
#if (defined(__x86_64__) || defined(__i386__)) && defined(__linux__) && defined(SYS_arch_prctl)
    const unsigned d = amx_edx();
    if (!((d >> 24) & 1) || !((d >> 25) & 1)) return 0;
    enum { ARCH_REQ_XCOMP_PERM = 0x1023, XFEATURE_XTILEDATA = 18 };
    return syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
#else
    return 0;
#endif
}

/* A level starts as a copy of the one below and overrides some kernels. A
 * tile kernel is only valid next to the vec_dot it was written with (they
 * share a summation order), so one inherited from below goes where the
 * level replaced the vec_dot without supplying a tile. */
static void drop_stale_tiles(tl_kernel_table *t, const tl_kernel_table *below) {
    for (int i = 0; i < TL_TYPE_COUNT; i++)
        if (t->vec_dot[i] != below->vec_dot[i]) {
            if (t->vec_dot_tile[i] == below->vec_dot_tile[i]) t->vec_dot_tile[i] = NULL;
            if (t->gemm_tile[i] == below->gemm_tile[i]) {
                t->gemm_tile[i] = NULL;
                t->gemm_prepare[i] = NULL;
            }
        }
    /* the packed kernels go with the GEMM they share prepared rows with */
    for (int i = 0; i < TL_TYPE_COUNT; i++)
        if (t->gemm_tile[i] != below->gemm_tile[i] && t->gemm_tile_pk[i] == below->gemm_tile_pk[i])
            t->gemm_tile_pk[i] = NULL;
}

/* The generic row loops run on the active level's dot_f32 / axpy_f32. */
static void dot_rows_generic(const float *q, const float *k, size_t ldk, int rows, int64_t n, float scale, float *out) {
    for (int r = 0; r < rows; r++) out[r] = tl_dot_f32(q, k + (size_t)r * ldk, n) * scale;
}

static void axpy_rows_generic(float *y, const float *a, const float *x, size_t ldx, int rows, int64_t n) {
    for (int r = 0; r < rows; r++) tl_axpy_f32(y, a[r], x + (size_t)r * ldx, n);
}

static void axpy_rows_multi_generic(int nq, float *const *y, const float *const *a, const float *x, size_t ldx,
                                    int rows, int64_t n) {
    for (int q = 0; q < nq; q++) tl_axpy_rows_f32(y[q], a[q], x, ldx, rows, n);
}

/* ggml's soft_max: libm expf, the sum in double. */
static void softmax_ref(float *x, int64_t n, float scale) {
    float maxv = -INFINITY;
    for (int64_t j = 0; j < n; j++) {
        x[j] *= scale;
        if (x[j] > maxv) maxv = x[j];
    }
    double sum = 0.0;
    for (int64_t j = 0; j < n; j++) {
        x[j] = expf(x[j] - maxv);
        sum += x[j];
    }
    float inv = (float)(1.0 / sum);
    for (int64_t j = 0; j < n; j++) x[j] *= inv;
}

static void attn_v8_prep_ref(const uint8_t *v, size_t rb, int rows, int hd, void *vp) {
    uint8_t *p = vp;
    for (int g = 0; g < hd / 32; g++, p += TL_V8_GROUP_BYTES) {
        float sc[16];
        int8_t *t = (int8_t *)(p + sizeof sc);
        for (int r = 0; r < 16; r++) {
            const uint8_t *row = v + (size_t)r * rb + (size_t)g * sizeof(block_q8_0);
            uint16_t d = 0;
            if (r < rows) memcpy(&d, row, 2);
            sc[r] = tl_f16_to_f32(d);
            for (int e = 0; e < 32; e++) t[(r / 4) * 128 + e * 4 + r % 4] = r < rows ? (int8_t)row[2 + e] : 0;
        }
        memcpy(p, sc, sizeof sc);
    }
}

static void attn_v8_sum_ref(int nq, float *const *y, const float *const *a, const void *vp, int r0, int r1, int hd) {
    for (int g = 0; g < hd / 32; g++) {
        const uint8_t *p = (const uint8_t *)vp + (size_t)g * TL_V8_GROUP_BYTES;
        float sc[16];
        const int8_t *t = (const int8_t *)(p + sizeof sc);
        memcpy(sc, p, sizeof sc);
        for (int q = 0; q < nq; q++) {
            float w[16], m = 0.0f;
            int u[16];
            for (int r = 0; r < 16; r++) {
                float x = r >= r0 && r < r1 ? a[q][r] * sc[r] : 0.0f;
                w[r] = x > 0.0f ? x : 0.0f; /* (NaN: 0) */
                if (w[r] > m) m = w[r];
            }
            if (!(m > 0.0f)) continue;
            const float inv = 255.0f / m, ds = m / 255.0f;
            for (int r = 0; r < 16; r++) {
                float f = w[r] * inv;
                f = f > 0.0f ? f : 0.0f;
                f = f < 255.0f ? f : 255.0f;
                u[r] = (int)nearbyintf(f);
            }
            for (int e = 0; e < 32; e++) {
                int32_t acc = 0;
                for (int r = 0; r < 16; r++) acc += u[r] * t[(r / 4) * 128 + e * 4 + r % 4];
                float *o = y[q] + g * 32 + e;
                *o = fmaf((float)acc, ds, *o);
            }
        }
    }
}

static void drop_stale_rows(tl_kernel_table *t, const tl_kernel_table *below) {
    if (t->dot_f32 != below->dot_f32 && t->dot_rows_f32 == below->dot_rows_f32) t->dot_rows_f32 = dot_rows_generic;
    if (t->axpy_f32 != below->axpy_f32 && t->axpy_rows_f32 == below->axpy_rows_f32) t->axpy_rows_f32 = axpy_rows_generic;
    if (t->axpy_rows_f32 != below->axpy_rows_f32 && t->axpy_rows_multi_f32 == below->axpy_rows_multi_f32)
        t->axpy_rows_multi_f32 = axpy_rows_multi_generic;
    if (t->dot_rows_f32 != below->dot_rows_f32 && t->dot_rows_f16 == below->dot_rows_f16) t->dot_rows_f16 = NULL;
    if (t->axpy_rows_multi_f32 != below->axpy_rows_multi_f32 && t->axpy_rows_multi_f16 == below->axpy_rows_multi_f16)
        t->axpy_rows_multi_f16 = NULL;
    if (t->dot_rows_f32 != below->dot_rows_f32 && t->scores_panels == below->scores_panels) {
        t->scores_panels = NULL;
        t->k_panels_f32 = NULL;
        t->k_panels_f16 = NULL;
    }
}

static void init_once(void) {
    cpu_level = detect_cpu();
    const char *env = getenv("TINYLOOP_ISA");
    if (env) {
        if (!strcasecmp(env, "scalar")) env_cap = TL_ISA_SCALAR;
        else if (!strcasecmp(env, "avx2")) env_cap = TL_ISA_AVX2;
        else if (!strcasecmp(env, "avx512")) env_cap = TL_ISA_AVX512;
        else if (!strcasecmp(env, "amx")) env_cap = TL_ISA_AMX;
    }
    tl_kernels_fill_ref(&tables[TL_ISA_SCALAR]);
    tables[TL_ISA_SCALAR].dot_rows_f32 = dot_rows_generic;
    tables[TL_ISA_SCALAR].axpy_rows_f32 = axpy_rows_generic;
    tables[TL_ISA_SCALAR].axpy_rows_multi_f32 = axpy_rows_multi_generic;
    tables[TL_ISA_SCALAR].softmax_f32 = softmax_ref;
    tables[TL_ISA_SCALAR].attn_v8_prep = attn_v8_prep_ref;
    tables[TL_ISA_SCALAR].attn_v8_sum = attn_v8_sum_ref;
    tables[TL_ISA_AVX2] = tables[TL_ISA_SCALAR];
    if (cpu_level >= TL_ISA_AVX2) tl_kernels_fill_avx2(&tables[TL_ISA_AVX2]);
    drop_stale_tiles(&tables[TL_ISA_AVX2], &tables[TL_ISA_SCALAR]);
    drop_stale_rows(&tables[TL_ISA_AVX2], &tables[TL_ISA_SCALAR]);
    tables[TL_ISA_AVX512] = tables[TL_ISA_AVX2];
    if (cpu_level >= TL_ISA_AVX512) tl_kernels_fill_avx512(&tables[TL_ISA_AVX512], has_vnni());
    if (cpu_level >= TL_ISA_AVX512 && has_bf16()) tl_bf16dot_fill_avx512(&tables[TL_ISA_AVX512]);
    drop_stale_tiles(&tables[TL_ISA_AVX512], &tables[TL_ISA_AVX2]);
    drop_stale_rows(&tables[TL_ISA_AVX512], &tables[TL_ISA_AVX2]);
    /* amx: the AVX-512 table with the packed GEMM on tiles (the same sums) */
    tables[TL_ISA_AMX] = tables[TL_ISA_AVX512];
    if (cpu_level >= TL_ISA_AVX512 && has_vnni() && has_amx()) {
        tl_gemm_fill_amx(&tables[TL_ISA_AMX]);
        if ((amx_edx() >> 22) & 1) tl_bf16_fill_amx(&tables[TL_ISA_AMX]); /* AMX-BF16 */
        cpu_level = TL_ISA_AMX;
    }
    const int level = cpu_level < env_cap ? cpu_level : env_cap;
    atomic_store(&active_level, level);
    atomic_store(&active, &tables[level]);
}

void tl_kernels_init(void) { pthread_once(&once, init_once); }

static inline const tl_kernel_table *kt(void) {
    const tl_kernel_table *t = atomic_load_explicit(&active, memory_order_acquire);
    if (__builtin_expect(t != NULL, 1)) return t;
    tl_kernels_init();
    return atomic_load(&active);
}

int tl_kernels_set_isa(int level) {
    tl_kernels_init();
    if (level < TL_ISA_SCALAR) level = TL_ISA_SCALAR;
    if (level > cpu_level) level = cpu_level;
    atomic_store(&active_level, level);
    atomic_store(&active, &tables[level]);
    return level;
}

int tl_kernels_isa(void) {
    tl_kernels_init();
    return atomic_load(&active_level);
}

const char *tl_isa_name(int level) {
    switch (level) {
    case TL_ISA_SCALAR: return "scalar";
    case TL_ISA_AVX2: return "avx2";
    case TL_ISA_AVX512: return "avx512";
    case TL_ISA_AMX: return "amx";
    default: return "unknown";
    }
}

tl_vec_dot_fn tl_vec_dot(int type) {
    if (type < 0 || type >= TL_TYPE_COUNT) return NULL;
    return kt()->vec_dot[type];
}

tl_vec_dot_fn tl_vec_dot_ref(int type) {
    if (type < 0 || type >= TL_TYPE_COUNT) return NULL;
    tl_kernels_init();
    return tables[TL_ISA_SCALAR].vec_dot[type];
}

void tl_vec_dot_tile(int type, int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw,
                     const void *x, size_t ldx) {
    const tl_kernel_table *t = kt();
    if (t->vec_dot_tile[type]) {
        t->vec_dot_tile[type](n, nr, nt, out, ldo, w, ldw, x, ldx);
        return;
    }
    const tl_vec_dot_fn dot = t->vec_dot[type];
    for (int r = 0; r < nr; r++)
        for (int j = 0; j < nt; j++)
            dot(n, &out[(size_t)j * ldo + r], (const uint8_t *)w + (size_t)r * ldw, (const uint8_t *)x + (size_t)j * ldx);
}

int tl_bf16dot_has(void) { return kt()->bf16dot_tile != NULL; }

void tl_bf16dot_tile(int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw, const void *x,
                     size_t ldx, void *work) {
    kt()->bf16dot_tile(n, nr, nt, out, ldo, w, ldw, x, ldx, work);
}

int tl_gemm_has(int type) { return type >= 0 && type < TL_TYPE_COUNT && kt()->gemm_tile[type] != NULL; }

void tl_gemm_prepare(int type, const float *x, void *xp, int64_t n) { kt()->gemm_prepare[type](x, xp, n); }

void tl_gemm_tile(int type, int64_t n, int nr, int nt, float *out, size_t ldo, const void *w, size_t ldw,
                  const void *xp, size_t ldx, void *work) {
    kt()->gemm_tile[type](n, nr, nt, out, ldo, w, ldw, xp, ldx, work);
}

int tl_pack_rows(int type) {
    return type >= 0 && type < TL_TYPE_COUNT && kt()->gemm_tile_pk[type] != NULL ? kt()->pack_rows : 0;
}

/* Packed rows at a level without a kernel for them (a test switching the
 * level, or prepared rows of a level that has its own GEMM): each 8-row
 * group back to plain rows in work, then the level's vec_dot_tile, which
 * reads the q8_0 row at the start of a prepared one. */
void tl_packed_tile(int type, int G, int prepared, int64_t n, int nr, int nt, float *out, size_t ldo, const void *w,
                    size_t ldw, const void *x, size_t ldx, void *work) {
    if (prepared && tl_pack_rows(type) == G) {
        kt()->gemm_tile_pk[type](n, nr, nt, out, ldo, w, ldw, x, ldx, work);
        return;
    }
    for (int r0 = 0; r0 < nr; r0 += G) {
        tl_unpack_group(type, G, (const uint8_t *)w + (size_t)r0 * ldw, n, work);
        tl_vec_dot_tile(type, n, G, nt, out + r0, ldo, work, ldw, x, ldx);
    }
}

void tl_quantize_row(int type, const float *src, void *dst, int64_t n) {
    if (type == TL_TYPE_Q8_0) kt()->quantize_q8_0(src, dst, n);
    else if (type == TL_TYPE_Q8_K) kt()->quantize_q8_K(src, dst, n);
    else if (type == TL_TYPE_F16) kt()->f32_to_f16_row(src, dst, n);
    else tl_quantize_row_ref(type, src, dst, n);
}

void tl_f16_to_f32_row(const uint16_t *src, float *dst, int64_t n) { kt()->f16_to_f32_row(src, dst, n); }
void tl_dequant_q8_0_blocks(const void *src, float *dst, int64_t nb) { kt()->dequant_q8_0(src, dst, nb); }
void tl_dequant_q4_0_blocks(const void *src, float *dst, int64_t nb) { kt()->dequant_q4_0(src, dst, nb); }
void tl_dequant_q4_1_blocks(const void *src, float *dst, int64_t nb) { kt()->dequant_q4_1(src, dst, nb); }
void tl_f32_to_f16_row(const float *src, uint16_t *dst, int64_t n) { kt()->f32_to_f16_row(src, dst, n); }

float tl_dot_f32(const float *a, const float *b, int64_t n) { return kt()->dot_f32(a, b, n); }
float tl_dot_f16_f32(const uint16_t *a, const float *b, int64_t n) { return kt()->dot_f16_f32(a, b, n); }
void tl_axpy_f32(float *y, float a, const float *x, int64_t n) { kt()->axpy_f32(y, a, x, n); }
void tl_axpy_f16(float *y, float a, const uint16_t *x, int64_t n) { kt()->axpy_f16(y, a, x, n); }
void tl_gelu_tanh_mul(float *h, const float *g, int64_t n) { kt()->gelu_tanh_mul(h, g, n); }
void tl_silu_mul(float *h, const float *g, int64_t n) { kt()->silu_mul(h, g, n); }
double tl_sum_sq(const float *x, int64_t n) { return kt()->sum_sq(x, n); }
void tl_dot_rows_f32(const float *q, const float *k, size_t ldk, int rows, int64_t n, float scale, float *out) {
    kt()->dot_rows_f32(q, k, ldk, rows, n, scale, out);
}
void tl_axpy_rows_f32(float *y, const float *a, const float *x, size_t ldx, int rows, int64_t n) {
    kt()->axpy_rows_f32(y, a, x, ldx, rows, n);
}
void tl_axpy_rows_multi_f32(int nq, float *const *y, const float *const *a, const float *x, size_t ldx, int rows,
                            int64_t n) {
    kt()->axpy_rows_multi_f32(nq, y, a, x, ldx, rows, n);
}
void tl_softmax_f32(float *x, int64_t n, float scale) { kt()->softmax_f32(x, n, scale); }
size_t tl_attn_v8_bytes(int hd) { return (size_t)(hd / 32) * TL_V8_GROUP_BYTES; }
void tl_attn_v8_prep(const uint8_t *v, size_t row_bytes, int rows, int hd, void *vp) {
    kt()->attn_v8_prep(v, row_bytes, rows, hd, vp);
}
void tl_attn_v8_sum(int nq, float *const *y, const float *const *a, const void *vp, int r0, int r1, int hd) {
    kt()->attn_v8_sum(nq, y, a, vp, r0, r1, hd);
}
int tl_attn_has_f16_rows(void) { return kt()->dot_rows_f16 && kt()->axpy_rows_multi_f16; }
void tl_dot_rows_f16(const float *q, const uint16_t *k, size_t ldk, int rows, int64_t n, float scale, float *out) {
    kt()->dot_rows_f16(q, k, ldk, rows, n, scale, out);
}
int tl_attn_has_panels(int64_t n) { return kt()->scores_panels && n % 16 == 0; }
size_t tl_attn_panels_floats(int rows, int64_t n) { return (size_t)(rows + 15) / 16 * 16 * (size_t)n; }
void tl_attn_k_panels_f32(const float *k, size_t ldk, int rows, int64_t n, float *kp) {
    kt()->k_panels_f32(k, ldk, rows, n, kp);
}
void tl_attn_k_panels_f16(const uint16_t *k, size_t ldk, int rows, int64_t n, float *kp) {
    kt()->k_panels_f16(k, ldk, rows, n, kp);
}
void tl_attn_scores_panels(int nq, const float *const *q, const float *kp, int rows, int64_t n, float scale,
                           float *const *out) {
    kt()->scores_panels(nq, q, kp, rows, n, scale, out);
}
void tl_axpy_rows_multi_f16(int nq, float *const *y, const float *const *a, const uint16_t *x, size_t ldx, int rows,
                            int64_t n) {
    kt()->axpy_rows_multi_f16(nq, y, a, x, ldx, rows, n);
}
