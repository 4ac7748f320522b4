/* tokenize_async.h - tokenization jobs off the caller's thread
 * (tokenize_async.c). Internal; submit/take/release are in tinyloop.h. */
#ifndef TL_TOKENIZE_ASYNC_H
#define TL_TOKENIZE_ASYNC_H

#include "tinyloop.h"

/* Stops the tokenizer thread and frees every job (model close). */
void tl_tokq_free(tl_model *m);

#endif
