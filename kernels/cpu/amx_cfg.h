/* amx_cfg.h - the AMX palette-1 tile configuration (LDTILECFG's 64-byte
 * operand), for the AMX files (gemm_amx.c, bf16_amx.c). */
#ifndef TL_AMX_CFG_H
#define TL_AMX_CFG_H

#include <stdint.h>

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tl_tile_cfg;

/* GCC 12's <amxtileintrin.h> gives LDTILECFG a memory operand of 8 bytes
 * and TILELOADD / TILESTORED none at all (inline asm taking the address
 * as a plain register): as far as the compiler knows, the rest of the
 * configuration is never read, a tile store writes no memory and a tile
 * load reads none, so it may drop the configuration's stores, read a C
 * tile's buffer before the store that fills it, or sink the stores that
 * fill an A tile's copy past the load. tl_tile_loadconfig names the whole
 * 64 bytes; TL_TILE_FENCE goes after tile stores whose memory C code reads
 * next and between C stores and the tile loads of that memory. (Clang's
 * intrinsics are builtins that carry their memory effects.) */
static inline void tl_tile_loadconfig(const tl_tile_cfg *cfg) { __asm__ volatile("ldtilecfg %0" ::"m"(*cfg)); }
#define TL_TILE_FENCE() __asm__ volatile("" ::: "memory")

#endif
