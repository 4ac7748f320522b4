/* shape.h - the model's shape (shape.c): loop depth, the physical layer of
 * each virtual layer, sliding windows, and the sequences that run through
 * it. Internal. */
#ifndef TL_SHAPE_H
#define TL_SHAPE_H

#include "kv_blocks.h"
#include "tinyloop.h"

/* Sliding window of physical layer L (0: attends to everything). */
int tl_model_layer_window(const tl_model *m, int L);

/* Virtual depth for `loops` and the physical layer of virtual layer vl. */
int tl_model_depth(const tl_model *m, int loops);
int tl_model_phys_layer(const tl_model *m, int loops, int vl);
/* Effective loops: 1 without a loop block; the default when loops <= 0. */
int tl_model_effective_loops(const tl_model *m, int loops);

struct tl_seq {
    tl_model *model;
    int loops;
    int window;            /* cache_window: attend to the last `window` positions; 0 = all */
    int n_pos;             /* positions with KV written */
    tl_block_table bt;
};

#endif
