/* Output files of the commands (cli.h): checked before any work, written
 * all or nothing. */
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>

#include "cli.h"
#include "fxattn_checkpoint.h"
#include "fxattn_npy.h"

/* One output against the outputs before it and every input. */
static int check_output(const char *cmd, const fxt_path *outs, int i, const fxt_path *ins,
                        int n_ins)
{
    char err[600];
    const fxt_path *o = &outs[i];
    if (fxa_output_check(o->path, err, sizeof err) != FXA_OK)
        return fxt_fail(FXT_EXIT_BAD_INPUT, "%s %s: %s", cmd, o->opt, err);
    for (int j = 0; j < i; j++)
        if (outs[j].path && fxa_same_output(outs[j].path, o->path))
            return fxt_fail(FXT_EXIT_BAD_INPUT, "%s: %s %s and %s %s name the same file", cmd,
                            outs[j].opt, outs[j].path, o->opt, o->path);
    for (int j = 0; j < n_ins; j++)
        if (ins[j].path && fxa_same_output(ins[j].path, o->path))
            return fxt_fail(FXT_EXIT_BAD_INPUT,
                            "%s: the output %s %s is the input %s %s; write it elsewhere", cmd,
                            o->opt, o->path, ins[j].opt, ins[j].path);
    return 0;
}

int fxt_check_outputs(const char *cmd, const fxt_path *outs, int n_outs, const fxt_path *ins,
                      int n_ins)
{
    for (int i = 0; i < n_outs; i++) {
        int code = outs[i].path ? check_output(cmd, outs, i, ins, n_ins) : 0;
        if (code)
            return code;
    }
    return 0;
}

int fxt_check_output_vs_checkpoint(const char *cmd, const fxt_path *out, const fxt_path *weights)
{
    char err[600];
    char folder[4096];
    char shard[8192];
    struct stat sb;
    fxa_ckpt *c = NULL;
    if (!out->path || !weights->path || stat(weights->path, &sb) != 0 ||
        fxa_ckpt_open(weights->path, &c, err, sizeof err) != FXA_OK)
        return 0; /* nothing to compare, or the loader reports it */
    const char *slash = strrchr(weights->path, '/');
    if (S_ISDIR(sb.st_mode))
        snprintf(folder, sizeof folder, "%s", weights->path);
    else if (slash)
        snprintf(folder, sizeof folder, "%.*s", (int)(slash - weights->path + 1), weights->path);
    else
        snprintf(folder, sizeof folder, ".");
    int code = 0;
    for (int64_t i = 0; !code && i < fxa_ckpt_shard_count(c); i++) {
        snprintf(shard, sizeof shard, "%s/%s", folder, fxa_ckpt_shard_name(c, i));
        if (fxa_same_output(out->path, shard))
            code = fxt_fail(FXT_EXIT_BAD_INPUT,
                            "%s: the output %s %s is the file %s of the checkpoint %s %s; write "
                            "it elsewhere",
                            cmd, out->opt, out->path, fxa_ckpt_shard_name(c, i), weights->opt,
                            weights->path);
    }
    fxa_ckpt_close(c);
    return code;
}

/* 1 when path exists and is not a regular file: staging writes it in place. */
static int written_in_place(const char *path)
{
    struct stat sb;
    return stat(path, &sb) == 0 && !S_ISREG(sb.st_mode);
}

int fxt_write_npy_outputs(const fxt_npy_out *outs, int n)
{
    char err[600];
    fxa_staged st[FXT_MAX_OUTPUTS];
    fxa_staged *order[FXT_MAX_OUTPUTS];
    int staged = 0;
    fxa_status s = FXA_OK;
    if (n < 0 || n > FXT_MAX_OUTPUTS)
        return fxt_fail(FXT_EXIT_FAILURE, "internal: %d outputs at once", n);
    memset(st, 0, sizeof st);
    /* Files replaced by a rename first, devices and FIFOs (written as they
     * are staged) last: a failure while staging a file then leaves every
     * device unwritten. */
    for (int pass = 0; pass < 2 && s == FXA_OK; pass++) {
        for (int i = 0; i < n && s == FXA_OK; i++) {
            if (written_in_place(outs[i].path) != pass)
                continue;
            s = fxa_npy_stage_f32(outs[i].path, outs[i].ndim, outs[i].shape, outs[i].data,
                                  &st[staged], err, sizeof err);
            order[staged] = &st[staged];
            staged++;
        }
    }
    if (s == FXA_OK)
        s = fxa_staged_commit_all(order, staged, err, sizeof err);
    for (int i = 0; i < staged; i++)
        fxa_staged_discard(&st[i]);
    return s == FXA_OK ? 0 : fxt_fail(FXT_EXIT_FAILURE, "%s", err);
}
