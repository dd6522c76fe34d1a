/*
 * AMX tiles, which small_gemm.c and paged_decode.c use for bfloat16 where the CPU has
 * them: eight tile registers of up to 16 rows of 64 bytes, and one instruction that
 * multiplies a bfloat16 tile by another into a float32 tile (products exact, sums in
 * float32) at about 1,000 GMAC/s a core on the plugin's benchmark machine, against about
 * 40 for AVX512-BF16's dot product there.  HAVE_AMX is defined where this build targets
 * them (-march=native on such a CPU); amx_permitted() says whether the process may.
 */
#ifndef SLOTWISE_CPU_AMX_H
#define SLOTWISE_CPU_AMX_H

#if defined(__AVX512F__) && defined(__AMX_TILE__) && defined(__AMX_BF16__)
#define HAVE_AMX 1
#include <immintrin.h>
#include <stdint.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

/* The operand of _tile_loadconfig (palette 1): each tile's rows and bytes per row. */
typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes_per_row[16];
    uint8_t rows[16];
} TileConfig;

/* Linux gives a process the tile state only on request (arch_prctl); asked once, and a
 * refusal (an old kernel, a sandbox) leaves the kernels on their vector code. */
static inline int amx_permitted(void) {
    static int state = -1; /* -1 not asked yet; threads racing here ask twice, harmlessly */
    int known = __atomic_load_n(&state, __ATOMIC_RELAXED);
    if (known < 0) {
        known = syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */,
                        18 /* XFEATURE_XTILEDATA */) == 0;
        __atomic_store_n(&state, known, __ATOMIC_RELAXED);
    }
    return known;
}

/* Configures this thread's tiles: 16 rows of bytes_per_row[t] bytes for tile t. */
static inline void load_tile_config(const uint16_t bytes_per_row[8]) {
    TileConfig config;
    memset(&config, 0, sizeof config);
    config.palette = 1;
    for (int t = 0; t < 8; t++) { /* a tile of no bytes is unused: no rows either */
        config.rows[t] = bytes_per_row[t] ? 16 : 0;
        config.bytes_per_row[t] = bytes_per_row[t];
    }
    _tile_loadconfig(&config);
}
#endif

#endif
