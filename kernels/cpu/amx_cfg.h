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

#endif
