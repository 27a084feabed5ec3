#!/bin/sh
# The same transfer started by Open MPI or MPICH on the DTNs of a host file (one slot per DTN),
# sharing the work through a PostgreSQL queue: skewed data and nodes that die even out (a dead
# rank's leases expire after --lease and the others take its units). No MPI library is linked:
# mpirun only starts the processes; each reads OMPI_COMM_WORLD_RANK/SIZE (or PMI_RANK/PMI_SIZE).
mpirun -np 8 --hostfile dtns.txt -x LONGHAUL_TOKEN \
    longhaul cp --ranks auto --queue postgres://longhaul@pg.example.org/transfers \
    --servers far-dtn1.example.org,far-dtn2.example.org \
    -r /pfs/data/run7 far-dtn1.example.org:data/incoming/
