"""fxattn in Hugging Face diffusers (public entry: fxattn.diffusers).

backend           the "fxattn" attention backend of diffusers' dispatcher
processor         WanAttnProcessor: Wan's attention on fxattn, or the fused layer
wan_qkv           Wan's q, k, v projections as diffusers computes them
wan_parallel      parallelize(): Wan's sequence parallelism over MPI ranks
context_parallel  every other model's context-parallel plan on fxattn.mpi
"""
