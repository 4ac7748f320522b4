/* shape.h - the model's shape (shape.c): loop depth, the physical layer of
 * each virtual layer, sliding windows, layers without RoPE, and the
 * sequences that run through it. Internal. */
#ifndef TL_SHAPE_H
#define TL_SHAPE_H

#include "kv_blocks.h"
#include "tinyloop.h"

/* Sliding window of physical layer L (0: attends to everything). */
int tl_model_layer_window(const tl_model *m, int L);
/* 1 when physical layer L rotates Q and K (RoPE), 0 for a NoPE layer. */
int tl_model_layer_rope(const tl_model *m, int L);

/* The narrower of two attention windows (0: all positions). */
static inline int tl_window_narrower(int a, int b) { return a > 0 && (b == 0 || a < b) ? a : b; }

/* Virtual depth for `loops` and the physical layer of virtual layer vl. */
int tl_model_depth(const tl_model *m, int loops);
int tl_model_phys_layer(const tl_model *m, int loops, int vl);
/* Effective loops: 1 without a loop block; the default when loops <= 0. */
int tl_model_effective_loops(const tl_model *m, int loops);
/* The window virtual layer vl attends over under a request's cache_window:
 * the narrower of that and the layer's sliding window (0: all positions). */
int tl_model_vl_window(const tl_model *m, int loops, int cache_window, int vl);

/* Releases the blocks of seq's sliding-window layers that lie wholly
 * before the window of its next token (position n_pos): such a layer never
 * reads them again, so it holds about window / block_size + 1 blocks
 * however long the sequence grows. Global layers keep everything. The
 * owner of a sequence calls it after each pass (not tl_forward: a backend
 * test replays a pass over the same table). */
void tl_seq_drop_behind_windows(tl_model *m, tl_seq *seq);

struct tl_seq {
    tl_model *model;
    int loops;
    int window;            /* cache_window: attend to the last `window` positions; 0 = all */
    int n_pos;             /* positions with KV written */
    tl_block_table bt;
};

#endif
