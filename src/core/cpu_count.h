/* How many CPUs this process may use: its affinity mask (sched_getaffinity),
 * capped by a cgroup CPU quota (v2 cpu.max, v1 cpu.cfs_quota_us /
 * cpu.cfs_period_us; the tightest from the process's cgroup up to the
 * hierarchy's mount point). fxa_available_cpus() is public (fxattn.h). */
#ifndef FXA_CPU_COUNT_H
#define FXA_CPU_COUNT_H

#include <stddef.h>

/* This process's affinity mask as a bitmap (CPU c is bit c % 8 of byte
 * c / 8), malloc'ed, *n_bytes long; NULL when it cannot be read. */
unsigned char *fxa_affinity_mask(size_t *n_bytes);

/* The CPU quota (in CPUs, fractional) of the process whose cgroup file and
 * mountinfo are given (normally /proc/self/cgroup, /proc/self/mountinfo);
 * 0 when no quota is set or the files cannot be read. */
double fxa_cgroup_cpu_quota(const char *proc_cgroup, const char *mountinfo);

/* cpus capped by floor(quota) (quota 0: none), within [1, 1024]. */
int fxa_cap_by_quota(int cpus, double quota);

#endif
