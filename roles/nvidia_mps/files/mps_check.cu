// The nvidia_mps role's verify step runs this as an MPS client: it creates a CUDA context,
// runs one kernel and checks the result. Exit 0 only when everything worked.
#include <cstdio>
#include <cuda_runtime.h>

__global__ void mlinfra_fill(int *out, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        out[i] = i * 2;
}

int main(void)
{
    const int n = 1 << 16;
    int *dev = nullptr;
    static int host[1 << 16];
    cudaError_t err = cudaMalloc(&dev, n * sizeof(int));
    if (err == cudaSuccess) {
        mlinfra_fill<<<(n + 255) / 256, 256>>>(dev, n);
        err = cudaGetLastError();
    }
    if (err == cudaSuccess)
        err = cudaMemcpy(host, dev, n * sizeof(int), cudaMemcpyDeviceToHost);
    if (err != cudaSuccess) {
        std::fprintf(stderr, "mps-check: %s\n", cudaGetErrorString(err));
        return 1;
    }
    for (int i = 0; i < n; ++i) {
        if (host[i] != i * 2) {
            std::fprintf(stderr, "mps-check: wrong result at %d\n", i);
            return 2;
        }
    }
    cudaFree(dev);
    std::printf("mps-check: kernel ran, %d values checked\n", n);
    return 0;
}
