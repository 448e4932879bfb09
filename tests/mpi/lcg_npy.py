#!/usr/bin/env python3
"""Write a C-order '<f4' .npy of the given shape, values from a fixed LCG
(stdlib only), for the MPI test scripts:

    lcg_npy.py PATH SEED SPREAD DIM [DIM ...]

Value i is ((state_i >> 40) / 2**24 - 0.5) * SPREAD, state_i the i-th
step of Knuth's MMIX LCG from SEED: the same file for the same arguments.
"""

import struct
import sys

path, seed, spread = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
shape = [int(d) for d in sys.argv[4:]]
count = 1
for d in shape:
    count *= d
dims = ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "")
hdr = "{'descr': '<f4', 'fortran_order': False, 'shape': (%s), }" % dims
hdr += " " * (64 - (10 + len(hdr) + 1) % 64) + "\n"
state, vals = seed, []
for _ in range(count):
    state = (state * 6364136223846793005 + 1442695040888963407) % 2**64
    vals.append(((state >> 40) / 2**24 - 0.5) * spread)
with open(path, "wb") as f:
    f.write(b"\x93NUMPY\x01\x00" + struct.pack("<H", len(hdr)) + hdr.encode())
    f.write(struct.pack("<%df" % count, *vals))
