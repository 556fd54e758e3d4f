# Sourced by the script tests that launch ranks with mpirun: OpenMPI's settings for this machine
# (root, more ranks than cores, shared memory) and the command line in the array `mpi`.
command -v mpirun >/dev/null || { echo "$(basename "$0"): mpirun not found (Debian: openmpi-bin)" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mpi=(mpirun --allow-run-as-root --oversubscribe --mca btl self,vader)
