/* chat.c - chat templates and end-of-generation tokens.
 *
 * Jinja templates are not interpreted: the model's tokenizer.chat_template
 * is recognised by its markers (Gemma turns, ChatML, Llama 3 headers,
 * Llama 2 [INST], Phi-3 <|role|>, Phi-4's ChatML with <|im_sep|>) as
 * llama.cpp recognises them, and rendered by the matching formatter below. A model
 * without a template is taken to be a base model: it gets a plain
 * "role: content" transcript, which base models continue sensibly (the
 * Gemma 3 270M base model answers in it, and echoes Gemma turn markers it
 * was not tuned on). tl_model_set_chat_template overrides the choice. */
#include "chat.h"

#include <assert.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model.h"
#include "util.h"

enum {
    CHAT_PLAIN, CHAT_GEMMA, CHAT_CHATML, CHAT_LLAMA3, CHAT_LLAMA2, CHAT_PHI3, CHAT_PHI4,
    CHAT_MISTRAL_V7, CHAT_MISTRAL_V1, CHAT_MISTRAL_V3, CHAT_MISTRAL_V3_TEKKEN, CHAT_FALCON3, CHAT_GRANITE,
    CHAT_DEEPSEEK3, CHAT_COMMAND_R
};

/* DeepSeek V3 / R1 (and its Qwen / Llama distills) spell their markers
 * with U+FF5C (fullwidth |) and U+2581 (the SentencePiece space). */
#define FW_BAR "\xef\xbd\x9c"  /* U+FF5C */
#define SP_MARK "\xe2\x96\x81" /* U+2581 */
#define DS_USER "<" FW_BAR "User" FW_BAR ">"
#define DS_ASSISTANT "<" FW_BAR "Assistant" FW_BAR ">"
#define DS_EOS "<" FW_BAR "end" SP_MARK "of" SP_MARK "sentence" FW_BAR ">"
#define DS_BOS "<" FW_BAR "begin" SP_MARK "of" SP_MARK "sentence" FW_BAR ">"

/* Mistral's [INST] templates as llama.cpp tells them apart; any other
 * [INST] template is Llama 2's. */
static int inst_kind(const char *t) {
    if (strstr(t, "[SYSTEM_PROMPT]")) return CHAT_MISTRAL_V7;
    if (!strstr(t, "' [INST] ' + system_message") && !strstr(t, "[AVAILABLE_TOOLS]")) return CHAT_LLAMA2;
    if (strstr(t, " [INST]")) return CHAT_MISTRAL_V1;
    return strstr(t, "\"[INST]\"") ? CHAT_MISTRAL_V3_TEKKEN : CHAT_MISTRAL_V3;
}

void tl_chat_detect(tl_model *m) {
    gguf_str tmpl = {0};
    int has = m->file && gguf_get_str(m->file, "tokenizer.chat_template", &tmpl) == 1;
    m->chat_kind = CHAT_PLAIN;
    if (has) {
        char *t = strndup(tmpl.ptr, tmpl.len);
        if (t && strstr(t, "<start_of_turn>")) m->chat_kind = CHAT_GEMMA;
        else if (t && strstr(t, "<|im_start|>")) m->chat_kind = strstr(t, "<|im_sep|>") ? CHAT_PHI4 : CHAT_CHATML;
        else if (t && strstr(t, "<|start_header_id|>")) m->chat_kind = CHAT_LLAMA3;
        else if (t && strstr(t, "[INST]")) m->chat_kind = inst_kind(t);
        else if (t && strstr(t, "<|assistant|>") && strstr(t, "<|end|>")) m->chat_kind = CHAT_PHI3;
        else if (t && strstr(t, "<|assistant|>") && strstr(t, "<|user|>")) m->chat_kind = CHAT_FALCON3;
        else if (t && strstr(t, "<|start_of_role|>")) m->chat_kind = CHAT_GRANITE;
        else if (t && strstr(t, DS_ASSISTANT) && strstr(t, DS_USER) && strstr(t, DS_EOS)) m->chat_kind = CHAT_DEEPSEEK3;
        else if (t && strstr(t, "<|START_OF_TURN_TOKEN|>")) m->chat_kind = CHAT_COMMAND_R;
        free(t);
    }
    /* End of generation: EOS plus the turn-closing control tokens. Every
     * template marker is also kept, so that message content can never
     * become one, even where a vocab types it user-defined. */
    static const char *eog_texts[] = {"<end_of_turn>", "<|im_end|>",   "<|eot_id|>",
                                      "<|end|>",       "<|endoftext|>", "<|eom_id|>", "<|END_OF_TURN_TOKEN|>"};
    static const char *marker_texts[] = {"<start_of_turn>", "<end_of_turn>", "<|im_start|>", "<|im_end|>",
                                         "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                                         "<|begin_of_text|>", "<|end_of_text|>", "<|eom_id|>", "<|endoftext|>",
                                         "<|end|>", "<|user|>", "<|assistant|>", "<|system|>", "<|im_sep|>",
                                         "<s>", "</s>", "[INST]", "[/INST]", "[SYSTEM_PROMPT]",
                                         "[/SYSTEM_PROMPT]", "<|start_of_role|>", "<|end_of_role|>", DS_USER,
                                         DS_ASSISTANT, DS_EOS, DS_BOS, "<|START_OF_TURN_TOKEN|>",
                                         "<|END_OF_TURN_TOKEN|>", "<|SYSTEM_TOKEN|>", "<|USER_TOKEN|>",
                                         "<|CHATBOT_TOKEN|>"};
    m->n_eog = 0;
    m->n_chat_markers = 0;
    int eos = tl_tokenizer_eos(m->tok);
    if (eos >= 0) m->eog[m->n_eog++] = eos;
    int nv = tl_tokenizer_n_vocab(m->tok);
    for (int id = 0; id < nv && m->n_eog < TL_MAX_EOG; id++) {
        int type = tl_tokenizer_token_type(m->tok, id);
        if (type != TL_TOK_CONTROL && type != TL_TOK_USER_DEFINED) continue;
        const char *text = tl_tokenizer_token_text(m->tok, id);
        for (size_t k = 0; k < sizeof eog_texts / sizeof *eog_texts; k++)
            if (text && !strcmp(text, eog_texts[k]) && id != eos) m->eog[m->n_eog++] = id;
        for (size_t k = 0; k < sizeof marker_texts / sizeof *marker_texts; k++)
            if (text && !strcmp(text, marker_texts[k]) && m->n_chat_markers < TL_MAX_CHAT_MARKERS)
                m->chat_markers[m->n_chat_markers++] = id;
    }
}

static const char *kind_names[] = {"plain", "gemma", "chatml",     "llama3",     "llama2",
                                   "phi3",  "phi4",  "mistral-v7", "mistral-v1", "mistral-v3",
                                   "mistral-v3-tekken", "falcon3", "granite", "deepseek3", "command-r"};

int tl_model_set_chat_template(tl_model *m, const char *name) {
    if (!m || !name) return tl_set_error(TL_ERR_INVALID_ARG, "model and name must not be NULL");
    for (int k = 0; k < (int)(sizeof kind_names / sizeof *kind_names); k++)
        if (!strcmp(name, kind_names[k])) {
            m->chat_kind = k;
            return TL_OK;
        }
    return tl_set_error(TL_ERR_INVALID_ARG,
                        "chat template '%s' is not one of plain, gemma, chatml, llama3, llama2, phi3, phi4, "
                        "mistral-v7, mistral-v1, mistral-v3, mistral-v3-tekken, falcon3, granite, deepseek3, "
                        "command-r",
                        name);
}

const char *tl_model_chat_template(const tl_model *m) { return m ? kind_names[m->chat_kind] : ""; }

int tl_model_is_eog(const tl_model *m, int id) {
    for (int i = 0; i < m->n_eog; i++)
        if (m->eog[i] == id) return 1;
    return 0;
}

/* The rendering target: text into out (counting past cap, for -(needed)),
 * and, when spans is set, the byte ranges the template itself wrote
 * (markers), which are the only places control tokens may come from. */
typedef struct sbuf {
    char *out;
    int cap, len;
    tl_tok_span *spans; /* NULL: no recording */
    int n_spans, spans_cap, oom;
} sbuf;

static void put_n(sbuf *b, const char *s, int n, int marker) {
    if (n <= 0) return;
    if (b->len + n < b->cap) memcpy(b->out + b->len, s, (size_t)n);
    if (marker && b->spans) {
        tl_tok_span *last = b->n_spans ? &b->spans[b->n_spans - 1] : NULL;
        if (last && last->off + last->len == (size_t)b->len) {
            last->len += (size_t)n;
        } else if (b->n_spans < b->spans_cap) {
            b->spans[b->n_spans++] = (tl_tok_span){(size_t)b->len, (size_t)n};
        } else {
            b->oom = 1;
        }
    }
    b->len += n;
}

/* Message content: never becomes control tokens. */
static void put(sbuf *b, const char *s) { put_n(b, s, (int)strlen(s), 0); }
/* The template's own text (turn markers, role headers). */
static void mark(sbuf *b, const char *s) { put_n(b, s, (int)strlen(s), 1); }

/* One turn of the role-tagged formats: open, the role, after it, the
 * content, close (the template's text all but the content). */
static void role_turn(sbuf *b, const char *open, const char *role, const char *mid, const char *c,
                      const char *close) {
    mark(b, open);
    mark(b, role);
    mark(b, mid);
    put(b, c);
    mark(b, close);
}

static const char *role_name(int kind, const char *role) {
    if (kind == CHAT_GEMMA && !strcmp(role, "assistant")) return "model";
    if (kind == CHAT_COMMAND_R)
        return !strcmp(role, "system") ? "<|SYSTEM_TOKEN|>"
               : !strcmp(role, "user") ? "<|USER_TOKEN|>"
                                       : "<|CHATBOT_TOKEN|>";
    return role;
}

/* System messages not yet written (Gemma and Llama 2 fold them into the
 * first user turn), joined by blank lines: msgs[from, to) with role system. */
static void put_systems(sbuf *b, const tl_chat_message *msgs, int from, int to) {
    int first = 1;
    for (int j = from; j < to; j++) {
        if (strcmp(msgs[j].role, "system")) continue;
        if (!first) mark(b, "\n\n");
        put(b, msgs[j].content);
        first = 0;
    }
}

static int check_messages(const tl_chat_message *msgs, int n) {
    for (int i = 0; i < n; i++) {
        const char *r = msgs[i].role;
        if (!r || !msgs[i].content)
            return tl_set_error(TL_ERR_INVALID_ARG, "message %d has a NULL role or content", i);
        if (strcmp(r, "system") && strcmp(r, "user") && strcmp(r, "assistant"))
            return tl_set_error(TL_ERR_INVALID_ARG, "message %d has role '%s' (expected system, user or assistant)", i,
                                r);
    }
    return TL_OK;
}

/* llama.cpp's Mistral v1 / v3 / v3-tekken: one [INST] opens a turn that
 * system and user messages fill and an assistant message closes; v1 puts
 * a space before [INST] and [/INST], v3 after [INST] and before the
 * answer, which it trims; tekken neither. */
static void render_mistral(int kind, const tl_chat_message *msgs, int n, sbuf *b) {
    const char *lead = kind == CHAT_MISTRAL_V1 ? " " : "", *trail = kind == CHAT_MISTRAL_V3_TEKKEN ? "" : " ";
    int inside = 0;
    for (int i = 0; i < n; i++) {
        const char *role = msgs[i].role, *c = msgs[i].content;
        if (!inside) {
            mark(b, lead);
            mark(b, "[INST]");
            mark(b, trail);
            inside = 1;
        }
        if (!strcmp(role, "system")) {
            put(b, c);
            mark(b, "\n\n");
        } else if (!strcmp(role, "user")) {
            put(b, c);
            mark(b, lead);
            mark(b, "[/INST]");
        } else {
            mark(b, trail);
            size_t len = strlen(c), at = 0;
            if (kind == CHAT_MISTRAL_V3) { /* as llama.cpp's trim: " \t\n\r\f\v" */
                while (at < len && strchr(" \t\n\r\f\v", c[at])) at++;
                while (len > at && strchr(" \t\n\r\f\v", c[len - 1])) len--;
            }
            put_n(b, c + at, (int)(len - at), 0);
            mark(b, "</s>");
            inside = 0;
        }
    }
}

static void render(int kind, const tl_chat_message *msgs, int n, int add_assistant, sbuf *b) {
    if (kind == CHAT_MISTRAL_V1 || kind == CHAT_MISTRAL_V3 || kind == CHAT_MISTRAL_V3_TEKKEN) {
        render_mistral(kind, msgs, n, b); /* no assistant opening: the turn's [/INST] is it */
        return;
    }
    int pending = -1; /* first unwritten system message (Gemma, Llama 2) */
    for (int i = 0; i < n; i++) {
        const char *role = msgs[i].role, *c = msgs[i].content;
        switch (kind) {
        case CHAT_GEMMA:
        case CHAT_LLAMA2:
            if (!strcmp(role, "system")) {
                if (pending < 0) pending = i;
                break;
            }
            if (kind == CHAT_GEMMA) {
                mark(b, "<start_of_turn>");
                mark(b, role_name(kind, role));
                mark(b, "\n");
                if (pending >= 0 && !strcmp(role, "user")) {
                    put_systems(b, msgs, pending, i);
                    mark(b, "\n\n");
                    pending = -1;
                }
                put(b, c);
                mark(b, "<end_of_turn>\n");
            } else if (!strcmp(role, "user")) {
                mark(b, "[INST] ");
                if (pending >= 0) {
                    mark(b, "<<SYS>>\n");
                    put_systems(b, msgs, pending, i);
                    mark(b, "\n<</SYS>>\n\n");
                    pending = -1;
                }
                put(b, c);
                mark(b, " [/INST]");
            } else {
                mark(b, " ");
                put(b, c);
                mark(b, " </s>");
            }
            break;
        case CHAT_CHATML: role_turn(b, "<|im_start|>", role, "\n", c, "<|im_end|>\n"); break;
        case CHAT_LLAMA3: role_turn(b, "<|start_header_id|>", role, "<|end_header_id|>\n\n", c, "<|eot_id|>"); break;
        case CHAT_PHI3:    /* llama.cpp's LLM_CHAT_TEMPLATE_PHI_3 */
        case CHAT_FALCON3: /* LLM_CHAT_TEMPLATE_FALCON_3: the same without <|end|> */
            role_turn(b, "<|", role, "|>\n", c, kind == CHAT_PHI3 ? "<|end|>\n" : "\n");
            break;
        case CHAT_MISTRAL_V7: /* LLM_CHAT_TEMPLATE_MISTRAL_V7; no assistant opening either */
            if (!strcmp(role, "system")) {
                mark(b, "[SYSTEM_PROMPT] ");
                put(b, c);
                mark(b, "[/SYSTEM_PROMPT]");
            } else if (!strcmp(role, "user")) {
                mark(b, "[INST] ");
                put(b, c);
                mark(b, "[/INST]");
            } else {
                mark(b, " ");
                put(b, c);
                mark(b, "</s>");
            }
            break;
        case CHAT_GRANITE: /* LLM_CHAT_TEMPLATE_GRANITE */
            role_turn(b, "<|start_of_role|>", role, "<|end_of_role|>", c, "<|end_of_text|>\n");
            break;
        case CHAT_DEEPSEEK3: /* LLM_CHAT_TEMPLATE_DEEPSEEK_3: system text first, then the turns */
            if (!strcmp(role, "system")) {
                put(b, c);
                mark(b, "\n\n");
            } else if (!strcmp(role, "user")) {
                mark(b, DS_USER);
                put(b, c);
            } else {
                mark(b, DS_ASSISTANT);
                put(b, c);
                mark(b, DS_EOS);
            }
            break;
        case CHAT_PHI4: role_turn(b, "<|im_start|>", role, "<|im_sep|>", c, "<|im_end|>"); break; /* PHI_4 */
        case CHAT_COMMAND_R: /* LLM_CHAT_TEMPLATE_COMMAND_R: a token for each role */
            role_turn(b, "<|START_OF_TURN_TOKEN|>", role_name(kind, role), "", c, "<|END_OF_TURN_TOKEN|>");
            break;
        default: role_turn(b, "", role, ": ", c, "\n");
        }
    }
    if (pending >= 0) {
        /* Trailing system messages: without add_assistant, the open first
         * user turn, the text every conversation starting with them begins
         * with (a pinned prefix); with it, a user turn of their own rather
         * than nothing. */
        if (kind == CHAT_GEMMA) {
            mark(b, "<start_of_turn>user\n");
            put_systems(b, msgs, pending, n);
            mark(b, add_assistant ? "<end_of_turn>\n" : "\n\n");
        } else {
            mark(b, "[INST] <<SYS>>\n");
            put_systems(b, msgs, pending, n);
            mark(b, add_assistant ? "\n<</SYS>>\n\n [/INST]" : "\n<</SYS>>\n\n");
        }
    }
    if (add_assistant) {
        if (kind == CHAT_GEMMA) mark(b, "<start_of_turn>model\n");
        else if (kind == CHAT_CHATML) mark(b, "<|im_start|>assistant\n");
        else if (kind == CHAT_LLAMA3) mark(b, "<|start_header_id|>assistant<|end_header_id|>\n\n");
        else if (kind == CHAT_PHI3 || kind == CHAT_FALCON3) mark(b, "<|assistant|>\n");
        else if (kind == CHAT_GRANITE) mark(b, "<|start_of_role|>assistant<|end_of_role|>\n");
        else if (kind == CHAT_DEEPSEEK3) mark(b, DS_ASSISTANT);
        else if (kind == CHAT_PHI4) mark(b, "<|im_start|>assistant<|im_sep|>");
        else if (kind == CHAT_COMMAND_R) mark(b, "<|START_OF_TURN_TOKEN|><|CHATBOT_TOKEN|>");
        else if (kind == CHAT_PLAIN) mark(b, "assistant:");
    }
}

int tl_chat_format(const tl_model *m, const tl_chat_message *msgs, int n, int add_assistant, char *out, int cap) {
    if (!m || (n > 0 && !msgs) || n < 0 || cap < 0 || (cap > 0 && !out))
        return tl_set_error(TL_ERR_INVALID_ARG, "tl_chat_format: bad arguments (n %d, cap %d)", n, cap);
    int rc = check_messages(msgs, n);
    if (rc) return rc;
    sbuf b = {out, cap, 0, NULL, 0, 0, 0};
    render(m->chat_kind, msgs, n, add_assistant, &b);
    if (b.len >= cap) return -(b.len + 1);
    out[b.len] = 0;
    return b.len;
}

void tl_chat_rendered_free(tl_chat_rendered *r) {
    if (!r) return;
    free(r->text);
    free(r->markers);
    memset(r, 0, sizeof *r);
}

int tl_chat_render(const tl_model *m, const tl_chat_message *msgs, int n, int add_assistant, tl_chat_rendered *r) {
    memset(r, 0, sizeof *r);
    if (!m || (n > 0 && !msgs) || n < 0)
        return tl_set_error(TL_ERR_INVALID_ARG, "tl_chat_tokenize: bad arguments (n %d)", n);
    int rc = check_messages(msgs, n);
    if (rc) return rc;
    size_t total = 0;
    for (int i = 0; i < n; i++) total += strlen(msgs[i].content) + 64;
    if (total >= (size_t)INT_MAX / 2)
        return tl_set_error(TL_ERR_INVALID_ARG, "tl_chat_tokenize: %zu bytes of messages is too long", total);
    sbuf b = {NULL, 0, 0, NULL, 0, 0, 0};
    render(m->chat_kind, msgs, n, add_assistant, &b); /* measure */
    /* each message writes at most 6 marker runs, the ending 2 more */
    b.spans_cap = 6 * n + 8;
    b.cap = b.len + 1;
    b.out = malloc((size_t)b.cap);
    b.spans = malloc((size_t)b.spans_cap * sizeof *b.spans);
    if (!b.out || !b.spans) {
        free(b.out);
        free(b.spans);
        return tl_set_error(TL_ERR_NOMEM, "tl_chat_tokenize: out of memory for %d bytes", b.cap);
    }
    b.len = 0;
    render(m->chat_kind, msgs, n, add_assistant, &b);
    assert(!b.oom && b.len < b.cap);
    b.out[b.len] = 0;
    r->text = b.out;
    r->len = (size_t)b.len;
    r->markers = b.spans;
    r->n_markers = b.n_spans;
    return TL_OK;
}

int tl_chat_encode_rendered(const tl_model *m, const tl_chat_rendered *r, int32_t *out, int cap) {
    return tl_tokenizer_encode_marked(m->tok, r->text, r->len, 1, r->markers, r->n_markers, m->chat_markers,
                                      m->n_chat_markers, out, cap);
}

int tl_chat_tokenize(const tl_model *m, const tl_chat_message *msgs, int n, int add_assistant, int32_t *out,
                     int cap) {
    if (cap < 0 || (cap > 0 && !out))
        return tl_set_error(TL_ERR_INVALID_ARG, "tl_chat_tokenize: bad arguments (cap %d)", cap);
    tl_chat_rendered r;
    int rc = tl_chat_render(m, msgs, n, add_assistant, &r);
    if (rc) return rc;
    rc = tl_chat_encode_rendered(m, &r, out, cap);
    tl_chat_rendered_free(&r);
    return rc;
}

int tl_model_max_token_bytes(const tl_model *m) { return m ? tl_tokenizer_max_token_bytes(m->tok) : 0; }
