/* Row statistics, portable build (the spec: row_stats_impl.h). */
#include "../row_stats_impl.h"

FXA_ROW_STATS_TABLE(fxa_f32_rowstats__ref);
