/* Row statistics, built with -mavx512f (row_stats_impl.h; same bits as ref). */
#include "../row_stats_impl.h"

FXA_ROW_STATS_TABLE(fxa_f32_rowstats__avx512);
