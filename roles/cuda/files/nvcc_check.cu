// Compiled (never run) by the cuda role's verify step: proves nvcc finds a host compiler it
// supports and can build device code, which `nvcc --version` alone does not.
__global__ void mlinfra_scale(float *x, float factor)
{
    x[blockIdx.x * blockDim.x + threadIdx.x] *= factor;
}

int main(void)
{
    return 0;
}
