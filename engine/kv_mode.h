/* kv_mode.h - choosing a KV mode (option, environment) and converting rows
 * to and from the KV row types of kv_layout.h. */
#ifndef TL_KV_MODE_H
#define TL_KV_MODE_H

#include <stddef.h>
#include <stdint.h>

#include "kv_layout.h"
#include "tinyloop.h"

typedef struct tl_kv_mode {
    int type_k, type_v; /* enum tl_kv_type; store-h: the type of h (both) */
    int store_h;
} tl_kv_mode;

/* Parses a kv_mode string ("f16", "q8,f16", "h", "h:q8", ...; see
 * tinyloop.h). `what` names the source in the error ("kv_mode",
 * "--kv", ...). */
int tl_kv_mode_parse(const char *s, const char *what, tl_kv_mode *out);
/* The mode of a model's parameters: kv_mode, else kv_type, else the
 * environment (TINYLOOP_KV_INT8 / _INT4 / _H_MODE), else f16. */
int tl_kv_mode_resolve(const tl_model_params *p, tl_kv_mode *out);
/* Canonical name: "f16", "q8,f16", "h:q8". */
void tl_kv_mode_name(const tl_kv_mode *mode, char *out, size_t cap);
const char *tl_kv_type_name(int type);

/* n values (n a multiple of group) between f32 and a row type. Storing
 * runs once per new token; loading is what attention reads. */
void tl_kv_store_row(int type, int group, const float *src, uint8_t *dst, int n);
void tl_kv_load_row(int type, int group, const uint8_t *src, float *dst, int n);
/* The weight type (quants.h) a q8 / q4 row in groups of 32 is, block for
 * block: ggml's q8_0 / q4_1. */
int tl_kv_block_type(int type);

#endif
