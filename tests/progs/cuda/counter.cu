/* cuda_counter: a CUDA C++ program holding MIB MiB of device memory, which it changes at every
 * step with a kernel, for the tests of ckpt on a real GPU (tests/tests/gpu.rs, built there with
 * nvcc by scripts/gpu-check.sh).
 *
 * START is printed once CUDA is up. Deterministic: RESULT is a hash of the whole device memory at the end (copied back), equal to
 * an uninterrupted run's only if every byte of it came back after each restart. Every CUDA call
 * is checked: one that fails prints FAIL with the driver's error; PASS otherwise.
 *
 * --worker: once CUDA is up, forks a child that uses no GPU (as PyTorch's DataLoader workers
 * do) and computes on the CPU; its result, read through a pipe, goes into RESULT.
 *
 * Usage: cuda_counter MIB [SECONDS=5] [--worker]
 */
#include "../common.h"
#include <cuda_runtime.h>

#define CHECK(call)                                                                            \
    do {                                                                                       \
        cudaError_t e_ = (call);                                                               \
        if (e_ != cudaSuccess) {                                                               \
            fail("%s: %s (%s)", #call, cudaGetErrorString(e_), cudaGetErrorName(e_));          \
            return finish(0);                                                                  \
        }                                                                                      \
    } while (0)

__device__ static uint64_t dmix(uint64_t x)
{
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

__global__ void fill(uint64_t *a, size_t n)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        a[i] = dmix(i);
}

/* One step: every word of a window of the memory mixed with the step. */
__global__ void step_kernel(uint64_t *a, size_t n, size_t start, size_t len, uint64_t step)
{
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < len; k += (size_t)gridDim.x * blockDim.x) {
        size_t i = (start + k) % n;
        a[i] = dmix(a[i] ^ step);
    }
}

int main(int argc, char **argv)
{
    size_t mib = argc > 1 ? (size_t)atol(argv[1]) : 256;
    long steps = steps_arg(argc, argv, 2, 5);
    int worker = argc > 3 && strcmp(argv[3], "--worker") == 0;
    size_t n = mib * 1024 * 1024 / 8;
    uint64_t *a;
    CHECK(cudaMalloc(&a, n * 8));
    fill<<<1024, 256>>>(a, n);
    CHECK(cudaGetLastError());
    CHECK(cudaDeviceSynchronize());
    /* Once CUDA is up: a checkpoint during its start is not what these tests are about. */
    start_marker();
    int worker_fd = -1;
    pid_t child = worker ? cpu_worker_start(steps, &worker_fd, NULL) : -1;
    size_t window = n / 64 + 1;
    for (long s = 0; s < steps; s++) {
        step_kernel<<<256, 256>>>(a, n, (size_t)mix64(s) % n, window, (uint64_t)s);
        CHECK(cudaGetLastError());
        CHECK(cudaDeviceSynchronize());
        sleep_ms(STEP_MS);
    }
    /* The whole memory, hashed on the host, in slices. */
    size_t slice = 1 << 20;
    uint64_t *host = (uint64_t *)malloc(slice * 8), h = 0;
    for (size_t at = 0; at < n; at += slice) {
        size_t len = n - at < slice ? n - at : slice;
        CHECK(cudaMemcpy(host, a + at, len * 8, cudaMemcpyDeviceToHost));
        for (size_t i = 0; i < len; i++)
            h = mix64(h ^ host[i]);
    }
    if (worker)
        h = mix64(h ^ cpu_worker_result(child, worker_fd));
    CHECK(cudaFree(a));
    return finish(h);
}
