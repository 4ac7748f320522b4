/* chat.c - chat templates and end-of-generation tokens.
 *
 * Jinja templates are not interpreted: the model's tokenizer.chat_template
 * is recognised by its markers (Gemma turns, ChatML, Llama 3 headers,
 * Llama 2 [INST]) and rendered by the matching formatter below. A model
 * without a template is taken to be a base model: it gets a plain
 * "role: content" transcript, which base models continue sensibly (the
 * Gemma 3 270M base model answers in it, and echoes Gemma turn markers it
 * was not tuned on). tl_model_set_chat_template overrides the choice. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "util.h"

enum { CHAT_PLAIN, CHAT_GEMMA, CHAT_CHATML, CHAT_LLAMA3, CHAT_LLAMA2 };

void tl_chat_detect(tl_model *m) {
    gguf_str tmpl = {0};
    int has = m->file && gguf_get_str(m->file, "tokenizer.chat_template", &tmpl) == 1;
    m->chat_kind = CHAT_PLAIN;
    if (has) {
        char *t = strndup(tmpl.ptr, tmpl.len);
        if (t && strstr(t, "<start_of_turn>")) m->chat_kind = CHAT_GEMMA;
        else if (t && strstr(t, "<|im_start|>")) m->chat_kind = CHAT_CHATML;
        else if (t && strstr(t, "<|start_header_id|>")) m->chat_kind = CHAT_LLAMA3;
        else if (t && strstr(t, "[INST]")) m->chat_kind = CHAT_LLAMA2;
        free(t);
    }
    /* End of generation: EOS plus the turn-closing control tokens. */
    static const char *eog_texts[] = {"<end_of_turn>", "<|im_end|>", "<|eot_id|>", "<|end|>", "<|endoftext|>", "<|eom_id|>"};
    m->n_eog = 0;
    int eos = tl_tokenizer_eos(m->tok);
    if (eos >= 0) m->eog[m->n_eog++] = eos;
    int nv = tl_tokenizer_n_vocab(m->tok);
    for (int id = 0; id < nv && m->n_eog < TL_MAX_EOG; id++) {
        int type = tl_tokenizer_token_type(m->tok, id);
        if (type != TL_TOK_CONTROL && type != TL_TOK_USER_DEFINED) continue;
        const char *text = tl_tokenizer_token_text(m->tok, id);
        for (size_t k = 0; k < sizeof eog_texts / sizeof *eog_texts; k++)
            if (text && !strcmp(text, eog_texts[k]) && id != eos) m->eog[m->n_eog++] = id;
    }
}

static const char *kind_names[] = {"plain", "gemma", "chatml", "llama3", "llama2"};

int tl_model_set_chat_template(tl_model *m, const char *name) {
    if (!m || !name) return tl_set_error(TL_ERR_INVALID_ARG, "model and name must not be NULL");
    for (int k = 0; k < (int)(sizeof kind_names / sizeof *kind_names); k++)
        if (!strcmp(name, kind_names[k])) {
            m->chat_kind = k;
            return TL_OK;
        }
    return tl_set_error(TL_ERR_INVALID_ARG, "chat template '%s' is not one of plain, gemma, chatml, llama3, llama2",
                        name);
}

const char *tl_model_chat_template(const tl_model *m) { return m ? kind_names[m->chat_kind] : ""; }

int tl_model_is_eog(const tl_model *m, int id) {
    for (int i = 0; i < m->n_eog; i++)
        if (m->eog[i] == id) return 1;
    return 0;
}

typedef struct {
    char *out;
    int cap, len;
} sbuf;

static void put(sbuf *b, const char *s) {
    int n = (int)strlen(s);
    if (b->len + n < b->cap) memcpy(b->out + b->len, s, (size_t)n);
    b->len += n;
}

static const char *role_name(int kind, const char *role) {
    if (kind == CHAT_GEMMA && !strcmp(role, "assistant")) return "model";
    return role;
}

int tl_chat_format(const tl_model *m, const tl_chat_message *msgs, int n, int add_assistant, char *out, int cap) {
    if (!m || (n > 0 && !msgs) || n < 0 || cap < 0 || (cap > 0 && !out))
        return tl_set_error(TL_ERR_INVALID_ARG, "tl_chat_format: bad arguments (n %d, cap %d)", n, cap);
    for (int i = 0; i < n; i++) {
        const char *r = msgs[i].role;
        if (!r || !msgs[i].content)
            return tl_set_error(TL_ERR_INVALID_ARG, "message %d has a NULL role or content", i);
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant"))
            return tl_set_error(TL_ERR_INVALID_ARG, "message %d has role '%s' (expected system, user or assistant)", i,
                                r);
    }
    sbuf b = {out, cap, 0};
    int kind = m->chat_kind;
    const char *pending_system = NULL; /* Gemma and Llama 2 fold the system prompt into the first user turn */
    for (int i = 0; i < n; i++) {
        const char *role = msgs[i].role, *c = msgs[i].content;
        switch (kind) {
        case CHAT_GEMMA:
        case CHAT_LLAMA2:
            if (!strcmp(role, "system")) {
                pending_system = c;
                break;
            }
            if (kind == CHAT_GEMMA) {
                put(&b, "<start_of_turn>");
                put(&b, role_name(kind, role));
                put(&b, "\n");
                if (pending_system && !strcmp(role, "user")) {
                    put(&b, pending_system);
                    put(&b, "\n\n");
                    pending_system = NULL;
                }
                put(&b, c);
                put(&b, "<end_of_turn>\n");
            } else if (!strcmp(role, "user")) {
                put(&b, "[INST] ");
                if (pending_system) {
                    put(&b, "<<SYS>>\n");
                    put(&b, pending_system);
                    put(&b, "\n<</SYS>>\n\n");
                    pending_system = NULL;
                }
                put(&b, c);
                put(&b, " [/INST]");
            } else {
                put(&b, " ");
                put(&b, c);
                put(&b, " </s>");
            }
            break;
        case CHAT_CHATML:
            put(&b, "<|im_start|>");
            put(&b, role);
            put(&b, "\n");
            put(&b, c);
            put(&b, "<|im_end|>\n");
            break;
        case CHAT_LLAMA3:
            put(&b, "<|start_header_id|>");
            put(&b, role);
            put(&b, "<|end_header_id|>\n\n");
            put(&b, c);
            put(&b, "<|eot_id|>");
            break;
        default:
            put(&b, role);
            put(&b, ": ");
            put(&b, c);
            put(&b, "\n");
        }
    }
    if (add_assistant) {
        if (kind == CHAT_GEMMA) put(&b, "<start_of_turn>model\n");
        else if (kind == CHAT_CHATML) put(&b, "<|im_start|>assistant\n");
        else if (kind == CHAT_LLAMA3) put(&b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        else if (kind == CHAT_PLAIN) put(&b, "assistant:");
    }
    if (b.len >= cap) return -(b.len + 1);
    out[b.len] = 0;
    return b.len;
}
