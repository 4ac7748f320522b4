/* weights.c - where the matmul weights live after load, and in what form.
 *
 * They move from the file's mapping into one buffer on transparent huge
 * pages (tl_alloc_huge), 1 MiB of rows at a time, and the file's pages
 * behind each piece are dropped from the private mapping (MADV_DONTNEED:
 * nothing reads them again), so RSS does not grow and load never holds
 * two copies of a matrix. A decode step streams every matrix once: on
 * 2 MiB pages the hardware prefetcher is not stopped at each 4 KiB
 * boundary and the TLB covers the matrix (Zen 4, one thread, 512-token
 * context: Q8_0 matmuls 7.0-8.4 -> 5.8-7.6 ms a token, F16 decode 51-58 ->
 * 62-71 tok/s). The cost: processes opening the same file no longer share
 * its page cache pages.
 *
 * On the way, q8_0 / q4_0 / q5_0 (and at AVX-512 q4_1) matrices with a
 * multiple of G rows are repacked into the row-interleaved order the
 * active kernel level reads natively (TL_PACK8 at AVX2, TL_PACK16 at
 * AVX-512), so neither prefill nor decode
 * re-transposes rows; outputs are bitwise those on the file's layout.
 *
 * The repack mode (tl_model_params.repack, else $TINYLOOP_REPACK): "on"
 * (the default) as above; "off" (or "0") leaves every weight in the file's
 * mapping and layout; "bf16" also rounds F32 and F16 matrices to BF16 and
 * runs every BF16 matmul with its activations rounded to BF16 too, through
 * vdpbf16ps (tl_bf16dot_tile): twice the f32 FMA's products per
 * instruction, half the bytes for F32 weights, and lossy (the figures in
 * README "Models and weight types"). Only for the CPU and an mmap'd file. */
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "model.h"
#include "quants.h"
#include "util.h"

enum { MODE_ON, MODE_OFF, MODE_BF16 };

static int mode_of(const char *v, int *mode) {
    if (!v || !*v || !strcmp(v, "on")) *mode = MODE_ON;
    else if (!strcmp(v, "off") || !strcmp(v, "0")) *mode = MODE_OFF;
    else if (!strcmp(v, "bf16")) *mode = MODE_BF16;
    else return -1;
    return 0;
}

int tl_weights_resolve(tl_model *m) {
    const char *given = m->params.repack, *env = getenv("TINYLOOP_REPACK");
    const char *v = given ? given : env;
    int mode;
    if (mode_of(v, &mode))
        return tl_set_error(TL_ERR_INVALID_ARG, "%s: expected \"on\", \"off\" or \"bf16\", got \"%.40s\"",
                            given ? "repack" : "TINYLOOP_REPACK", v);
    m->repack_mode = mode;
    if (mode != MODE_BF16) return TL_OK;
    if (m->backend)
        return tl_set_error(TL_ERR_UNSUPPORTED, "repack \"bf16\" is for the CPU backend, not %s",
                            tl_backend_name(m));
    if (!tl_bf16dot_has())
        return tl_set_error(TL_ERR_UNSUPPORTED, "repack \"bf16\" needs AVX512_BF16 at the active kernel level "
                                                "(this CPU has none, or TINYLOOP_ISA caps the level at %s)",
                            tl_isa_name(tl_kernels_isa()));
    m->bf16_act = 1;
    return TL_OK;
}

/* The type a matrix has in the arena: BF16 for F32/F16 in the BF16 mode. */
static int arena_type(const tl_model *m, const tl_weight *w) {
    return m->bf16_act && (w->type == TL_TYPE_F32 || w->type == TL_TYPE_F16) ? TL_TYPE_BF16 : w->type;
}

static size_t arena_bytes(const tl_model *m, const tl_weight *w) {
    return (tl_row_size(arena_type(m, w), w->n_in) * (size_t)w->n_out + 63) & ~(size_t)63;
}

static int pack_group_rows(const tl_weight *w) {
    const int G = tl_pack_rows(w->type);
    return G && w->n_out % G == 0 ? G : 0;
}

/* Row bytes of the largest temporary move_weight needs: G packed rows, or
 * one row widened to f32 for the BF16 conversion. */
static size_t tmp_bytes(const tl_model *m, const tl_weight *w) {
    size_t g = (size_t)pack_group_rows(w) * tl_row_size(w->type, w->n_in);
    size_t f = arena_type(m, w) != w->type ? (size_t)w->n_in * sizeof(float) : 0;
    return g > f ? g : f;
}

static void move_weight(const tl_model *m, tl_weight *w, uint8_t *dst, uint8_t *tmp) {
    const int to = arena_type(m, w), G = to == w->type ? pack_group_rows(w) : 0;
    const size_t rs = tl_row_size(w->type, w->n_in), ds = tl_row_size(to, w->n_in), bytes = rs * (size_t)w->n_out;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), src = (uintptr_t)w->data;
    const uintptr_t first = (src + page - 1) & ~(page - 1); /* the matrix's first whole page */
    int64_t step = (int64_t)((1u << 20) / (rs ? rs : 1));
    if (G) step = (step / G + 1) * G;
    if (step < 1) step = 1;
    for (int64_t r0 = 0; r0 < w->n_out; r0 += step) {
        const int64_t r1 = r0 + step < w->n_out ? r0 + step : w->n_out;
        const uint8_t *from = (const uint8_t *)w->data + (size_t)r0 * rs;
        if (to == w->type) {
            memcpy(dst + (size_t)r0 * ds, from, (size_t)(r1 - r0) * rs);
        } else {
            for (int64_t r = r0; r < r1; r++, from += rs) {
                tl_dequantize_row(w->type, from, (float *)tmp, w->n_in);
                tl_quantize_row(to, (const float *)tmp, dst + (size_t)r * ds, w->n_in);
            }
        }
        for (int64_t r = r0; G && r < r1; r += G) tl_pack_group(w->type, G, dst + (size_t)r * rs, w->n_in, tmp);
        /* whole pages of this matrix read so far (none shared with a neighbour) */
        const uintptr_t a = r0 ? ((src + (size_t)r0 * rs) & ~(page - 1)) : first;
        const uintptr_t b = (src + (r1 == w->n_out ? bytes : (size_t)r1 * rs)) & ~(page - 1);
        if (b > a && a >= first) (void)madvise((void *)a, b - a, MADV_DONTNEED);
    }
    w->data = dst;
    w->type = to;
    w->packed = G;
}

/* The first of the weights [0, i] bound to the same bytes as weight i. */
static size_t first_holder(const void *const *file_data, size_t i) {
    size_t k = 0;
    while (file_data[k] != file_data[i]) k++;
    return k;
}

void tl_weights_move(tl_model *m) {
    if (m->backend || !m->file->mapped || m->repack_mode == MODE_OFF) return;
    /* every matrix once, token_embd first and moved only when the output
     * matrix is tied to it (else only its looked-up rows are ever read,
     * and moving it would bring the rest into RSS); then it is packed as
     * the output matmul reads it, and lookups gather a row from its group
     * (tl_packed_row_dequantize; Gemma 3 270M: the tied q8_0 matrix is 178
     * of the 248 MB a decode step reads). A tensor bound to two weights
     * (tied output, or a file naming the same bytes twice) is moved once
     * and read the same way by both */
    size_t n = 0, cap = (size_t)m->hp.n_layer * (12 + 3 * (size_t)m->hp.n_expert) + 2, total = 0, widest = 1;
    tl_weight **all = malloc(cap * sizeof *all);
    const void **file_data = malloc(cap * sizeof *file_data); /* each weight's bytes in the file */
    uint8_t *tmp = NULL;
    int tied = 0;
    if (!all || !file_data) goto out;
    all[n++] = &m->tok_embd;
    for (int i = 0; i < m->hp.n_layer; i++) {
        tl_layer *L = &m->layers[i];
        n += (size_t)tl_layer_matrices(L, all + n);
        for (int e = 0; L->x_gate && e < m->hp.n_expert; e++) { /* each expert a matrix of its own */
            all[n++] = &L->x_gate[e];
            all[n++] = &L->x_up[e];
            all[n++] = &L->x_down[e];
        }
    }
    all[n++] = &m->output;
    for (size_t i = 0; i < n; i++) {
        file_data[i] = all[i]->data;
        tied |= i > 0 && first_holder(file_data, i) == 0;
    }
    /* first the arena's size: each tensor once */
    for (size_t i = !tied; i < n; i++) {
        if (first_holder(file_data, i) < i) continue;
        total += arena_bytes(m, all[i]);
        size_t t = tmp_bytes(m, all[i]);
        if (t > widest) widest = t;
    }
    if (!total || !(m->weight_arena = tl_alloc_huge(total)) || !(tmp = tl_alloc_aligned(widest))) goto out;
    uint8_t *dst = m->weight_arena;
    for (size_t i = !tied; i < n; i++) {
        size_t k = first_holder(file_data, i);
        if (k < i) {
            const tl_weight *prev = all[k];
            all[i]->data = prev->data;
            all[i]->type = prev->type;
            all[i]->packed = prev->packed;
        } else {
            size_t b = arena_bytes(m, all[i]);
            move_weight(m, all[i], dst, tmp);
            dst += b;
        }
    }
out:
    tl_free_aligned(tmp);
    free(all);
    free(file_data);
}
