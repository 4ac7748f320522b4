/* chat.h - chat templates (chat.c): detection, rendering with the marker
 * spans the template wrote, segment-wise encoding, end-of-generation ids.
 * Internal; the public calls are in tinyloop.h. */
#ifndef TL_CHAT_H
#define TL_CHAT_H

#include "tinyloop.h"
#include "tokenizer.h"

void tl_chat_detect(tl_model *m);
/* A conversation rendered with its template: text and the byte ranges the
 * template wrote (markers). Owned by the struct; free with _free. */
typedef struct tl_chat_rendered {
    char *text;
    size_t len;
    tl_tok_span *markers;
    int n_markers;
} tl_chat_rendered;
int tl_chat_render(const tl_model *m, const tl_chat_message *msgs, int n, int add_assistant, tl_chat_rendered *r);
/* Tokenizes a rendered conversation (BOS as the vocab says); as tl_chat_tokenize. */
int tl_chat_encode_rendered(const tl_model *m, const tl_chat_rendered *r, int32_t *out, int cap);
void tl_chat_rendered_free(tl_chat_rendered *r);

/* Whether id ends a generation (EOS or a turn-closing token). */
int tl_model_is_eog(const tl_model *m, int id);

#endif
