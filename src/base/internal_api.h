/*
 * FXA_INTERNAL marks the few core functions that fxattn's other libraries
 * call across shared-library boundaries (libfxattn_proj uses the context's
 * pool, error message, CPU features and aligned allocation of
 * libfxattn.so). They are exported from libfxattn.so but are not part of
 * the public API: no header in include/ declares them, and they may change
 * with any release.
 */
#ifndef FXA_INTERNAL_API_H
#define FXA_INTERNAL_API_H

#define FXA_INTERNAL __attribute__((visibility("default")))

#endif
