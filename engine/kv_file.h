/* kv_file.h - the on-disk format of a spilled logical KV block (tier 3).
 *
 * One file per logical block: `depth` physical blocks (one per virtual
 * layer) of `block_bytes` each, the K/V of positions [lb*block_size,
 * (lb+1)*block_size) of a cached prefix. The file is named after the
 * block's 32-byte chain hash (the caller computes it) and holds the
 * block's tokens, so a reader can check the prefix it stands for.
 *
 * Layout (little-endian, no padding, every field written byte by byte):
 *
 *   off  size  field
 *   ---  ----  -----------------------------------------------------------
 *     0     8  magic "TLKVBLK\0"
 *     8     4  format version (1)
 *    12     4  header length (168)
 *    16    32  model_id     SHA-256 of the GGUF metadata and tensor table
 *    48    16  kv_mode      canonical name, NUL-terminated, zero-filled
 *    64     4  block_size   positions per block, 1..4096
 *    68     4  depth        physical blocks, 1..4096
 *    72     8  block_bytes  bytes of one physical block, 1..2^30
 *    80     4  loops        \
 *    84     4  window        } namespace (each >= 0)
 *    88     8  salt         /
 *    96     4  lb           logical block index (>= 0)
 *   100    32  key          this block's chain hash (the file's name)
 *   132    32  parent       the previous block's chain hash
 *   164     4  CRC32C of bytes 0..164
 *   168        tokens       block_size x int32
 *     +        absent       ceil(depth / 8) bytes, bit d (byte d/8, bit d%8) set:
 *                           physical block d is not in the file (a sliding-window
 *                           layer had released it); bits past depth are zero
 *     +     4  CRC32C of the tokens and the absent bitmap
 *     +        block CRCs   depth x uint32, CRC32C of each present block (0 if absent)
 *     +        payload      the present blocks in layer order, block_bytes each
 *
 *   +--------+--------+--------+-----+------------+---------+------ ... ------+
 *   | header | tokens | absent | CRC | CRC 0..d-1 | block a | ... | block z   |
 *   +--------+--------+--------+-----+------------+---------+------ ... ------+
 *
 * The file's size is exactly tl_kvf_file_size(); anything else is refused.
 * Writers go through a temp file and rename(), so a reader sees the old
 * file or the new one, never a mix; the CRCs catch what a crash or a disk
 * left behind (files are not fsynced: a lost spill is only a cache miss).
 *
 * Thread-safety: every function is reentrant; concurrent writers of one
 * key (threads or processes) leave one of their files whole. */
#ifndef TL_KV_FILE_H
#define TL_KV_FILE_H

#include <stddef.h>
#include <stdint.h>

#define TL_KVF_VERSION 1
#define TL_KVF_HEADER_BYTES 168
#define TL_KVF_MAX_BLOCK_SIZE 4096
#define TL_KVF_MAX_DEPTH 4096
#define TL_KVF_MAX_BLOCK_BYTES ((uint64_t)1 << 30)
#define TL_KVF_NAME_BYTES 70 /* 64 hex digits + ".tlkv" + NUL */

typedef struct tl_kvf_meta {
    uint8_t model_id[32];   /* SHA-256 of the GGUF's metadata and tensor table (caller computes) */
    char kv_mode[16];       /* canonical KV mode name, NUL-terminated ("f16", "q8,f16", "h:q8") */
    int32_t block_size;     /* positions per block */
    int32_t depth;          /* physical blocks (virtual layers) in this logical block */
    uint64_t block_bytes;   /* bytes of one physical block */
    int32_t loops, window;  /* namespace: loops and cache_window */
    uint64_t salt;          /* namespace: tenant salt */
    int32_t lb;             /* logical block index */
    uint8_t key[32];        /* this block's chain hash (the file's name) */
    uint8_t parent[32];     /* the previous block's chain hash */
    uint8_t absent[TL_KVF_MAX_DEPTH / 8]; /* bit d set: physical block d is not stored
                                             (all zero: every block present) */
} tl_kvf_meta;

/* Whether physical block d is stored, and how many are. */
static inline int tl_kvf_has(const tl_kvf_meta *m, int d) { return !(m->absent[d >> 3] >> (d & 7) & 1); }
int tl_kvf_n_present(const tl_kvf_meta *m);

/* Bytes of the whole file for m: header + tokens + CRCs + payload; 0 when
 * that overflows size_t or block_size/depth are negative. */
size_t tl_kvf_file_size(const tl_kvf_meta *m);

/* File name for a key: 64 lowercase hex digits + ".tlkv" (out >= 70 bytes). */
void tl_kvf_name(const uint8_t key[32], char *out);

/* Writes dir/<tl_kvf_name(m->key)> atomically: a temp file in dir
 * (".<name>.<pid>.<counter>.<random>.tmp", O_EXCL, mode 0600) written in
 * full, then renamed onto the final name. blocks[d] points at physical
 * block d (m->block_bytes each); tokens has m->block_size ids. m is checked
 * against the limits the reader applies, so a written file always parses.
 * Blocks m->absent marks are not read (blocks[d] may be NULL there).
 * Returns 0, or -1 with a message naming the path and the errno text in
 * err (cap bytes; err may be NULL); the temp file is removed on failure
 * and an existing file of that name is left as it was. */
int tl_kvf_write(const char *dir, const tl_kvf_meta *m, const int32_t *tokens, const void *const *blocks, char *err,
                 size_t cap);

/* Parses and validates a whole file image buf[0..n) (hostile input; buf
 * 4-byte aligned): magic, version, header CRC, every field's bounds, n
 * equal to the size the header implies, the tokens' CRC and each physical
 * block's CRC. On success fills *got, points *tokens (block_size ids) and
 * *payload (tl_kvf_n_present(got) * block_bytes bytes, the present blocks
 * in layer order) into buf and returns 0; else -1 with
 * the reason in err ("bad magic", "format version 7, expected 1", "block 3
 * checksum 0x... != 0x... in the file", "file is 1000 bytes, header says 5000"). */
int tl_kvf_parse(const uint8_t *buf, size_t n, tl_kvf_meta *got, const int32_t **tokens, const uint8_t **payload,
                 char *err, size_t cap);

/* Compares a parsed header's identity with what the reader expects:
 * model_id, kv_mode, block_size, depth, block_bytes, and when check_ns
 * also loops, window, salt and key (lb and parent are never compared).
 * Returns 0, or -1 with the field and both values in err ("another model
 * (id 1a2b...<64 hex>, expected ...)", "KV mode q8, expected f16",
 * "block size 32, expected 16"). */
int tl_kvf_check(const tl_kvf_meta *got, const tl_kvf_meta *expect, int check_ns, char *err, size_t cap);

/* Reads path whole (refusing a file over max_bytes before reading it),
 * parses it and checks it against expect (check_ns as above). On success
 * copies the expect->block_size tokens into tokens_out and the payload
 * into payload_out (payload_cap bytes there) and returns 0; else -1 with
 * "<path>: <reason>" in err, and the outputs are unspecified. */
int tl_kvf_read(const char *path, const tl_kvf_meta *expect, int check_ns, size_t max_bytes, int32_t *tokens_out,
                void *payload_out, size_t payload_cap, char *err, size_t cap);

#endif
