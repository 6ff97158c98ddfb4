// A stand-in for NVIDIA's libcuda.so, built by the tests (tests/cuda/fakecuda.py)
// so that the CUDA driver probe can be tested on machines without a GPU.
//
// It exports the driver API entry points the probe attaches to, under their
// real names and with their _v2/_ptsz/_ptds variants, with the real calling
// convention (every argument ignored except where said). What a call costs is
// set by the fake_* control functions: launches and copies spin on the CPU
// for a set time, synchronisations spin or sleep until the "GPU" is idle, and
// cuEventQuery/cuStreamQuery return CUDA_ERROR_NOT_READY (600) until then.
// cuGetProcAddress resolves names to these same exported functions, as the
// real driver's does for its public API (checked on a GPU by
// scripts/gpu_check.sh). No probed entry point calls another exported one,
// and the build keeps identical functions apart (-fno-ipa-icf), so a probe on
// one entry point sees exactly the calls made to it.

#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>
#include <string.h>
#include <time.h>

typedef int CUresult;
#define CUDA_SUCCESS 0
#define CUDA_ERROR_NOT_READY 600

static long long launch_ns = 0;    // CPU time each launch spins
static long long copy_ns = 0;      // CPU time each copy spins
static int sync_sleeps = 0;        // 1: synchronisations sleep; 0: they spin
static long long busy_until = 0;   // the "GPU" is busy until this CLOCK_MONOTONIC ns
static long long launches = 0;     // launches made (any entry point)

static long long now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static void spin_until(long long t)
{
    while (now_ns() < t) {
    }
}

static void spin_for(long long ns)
{
    if (ns > 0)
        spin_until(now_ns() + ns);
}

static CUresult wait_idle(void)
{
    long long t = busy_until;
    if (sync_sleeps) {
        long long left;
        while ((left = t - now_ns()) > 0) {
            struct timespec ts = {left / 1000000000LL, left % 1000000000LL};
            nanosleep(&ts, NULL);
        }
    } else {
        spin_until(t);
    }
    return CUDA_SUCCESS;
}

static CUresult launch(void)
{
    launches++;
    spin_for(launch_ns);
    return CUDA_SUCCESS;
}

static CUresult copy(void)
{
    spin_for(copy_ns);
    return CUDA_SUCCESS;
}

static CUresult query(void)
{
    return now_ns() < busy_until ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}

// -- control (not driver API) -------------------------------------------------
void fake_set_launch_ns(long long ns) { launch_ns = ns; }
void fake_set_copy_ns(long long ns) { copy_ns = ns; }
void fake_set_sync_sleeps(int on) { sync_sleeps = on; }
// The "GPU" stays busy for `ns` from now: syncs wait, queries say not ready.
void fake_busy_for(long long ns) { busy_until = now_ns() + ns; }
long long fake_launches(void) { return launches; }
// When the "GPU" is done: what a sync returning later waited for the CPU.
long long fake_busy_until(void) { return busy_until; }

// -- the driver API -------------------------------------------------------------
CUresult cuInit(unsigned int flags) { (void)flags; return CUDA_SUCCESS; }
CUresult cuDriverGetVersion(int *v) { if (v) *v = 12080; return CUDA_SUCCESS; }

#define LAUNCH(name) \
    CUresult name(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, \
                  unsigned bz, unsigned shmem, void *stream, void **params, void **extra) \
    { (void)f; (void)gx; (void)gy; (void)gz; (void)bx; (void)by; (void)bz; (void)shmem; \
      (void)stream; (void)params; (void)extra; return launch(); }
LAUNCH(cuLaunchKernel)
LAUNCH(cuLaunchKernel_ptsz)
LAUNCH(cuLaunchCooperativeKernel)
LAUNCH(cuLaunchCooperativeKernel_ptsz)

CUresult cuLaunchKernelEx(const void *config, void *f, void **params, void **extra)
{ (void)config; (void)f; (void)params; (void)extra; return launch(); }
CUresult cuLaunchKernelEx_ptsz(const void *config, void *f, void **params, void **extra)
{ (void)config; (void)f; (void)params; (void)extra; return launch(); }
CUresult cuGraphLaunch(void *exec, void *stream) { (void)exec; (void)stream; return launch(); }
CUresult cuGraphLaunch_ptsz(void *exec, void *stream) { (void)exec; (void)stream; return launch(); }

CUresult cuStreamSynchronize(void *stream) { (void)stream; return wait_idle(); }
CUresult cuStreamSynchronize_ptsz(void *stream) { (void)stream; return wait_idle(); }
CUresult cuEventSynchronize(void *event) { (void)event; return wait_idle(); }
CUresult cuCtxSynchronize(void) { return wait_idle(); }
CUresult cuStreamQuery(void *stream) { (void)stream; return query(); }
CUresult cuStreamQuery_ptsz(void *stream) { (void)stream; return query(); }
CUresult cuEventQuery(void *event) { (void)event; return query(); }

#define COPY_SYNC(name) \
    CUresult name(unsigned long long dst, const void *src, size_t n) \
    { (void)dst; (void)src; (void)n; return copy(); }
COPY_SYNC(cuMemcpyHtoD_v2)
COPY_SYNC(cuMemcpyHtoD_v2_ptds)
COPY_SYNC(cuMemcpyDtoH_v2)
COPY_SYNC(cuMemcpyDtoH_v2_ptds)
COPY_SYNC(cuMemcpyDtoD_v2)
COPY_SYNC(cuMemcpyDtoD_v2_ptds)
COPY_SYNC(cuMemcpy)
COPY_SYNC(cuMemcpy_ptds)

#define COPY_ASYNC(name) \
    CUresult name(unsigned long long dst, const void *src, size_t n, void *stream) \
    { (void)dst; (void)src; (void)n; (void)stream; return copy(); }
COPY_ASYNC(cuMemcpyAsync)
COPY_ASYNC(cuMemcpyAsync_ptsz)
COPY_ASYNC(cuMemcpyHtoDAsync_v2)
COPY_ASYNC(cuMemcpyHtoDAsync_v2_ptsz)
COPY_ASYNC(cuMemcpyDtoHAsync_v2)
COPY_ASYNC(cuMemcpyDtoHAsync_v2_ptsz)

// Not probed: no driver time worth a uprobe (tests check it is left alone).
CUresult cuCtxGetCurrent(void **ctx) { if (ctx) *ctx = NULL; return CUDA_SUCCESS; }

// The driver's own name resolution (cudart and torch call it): here dlsym of
// this library, so a pointer it returns is the exported entry point.
CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int version,
                             unsigned long long flags, int *status)
{
    (void)version; (void)flags;
    static const char *suffix[] = {"", "_v2", NULL};
    Dl_info info;
    void *found = NULL;
    if (dladdr((void *)cuGetProcAddress_v2, &info) && info.dli_fname) {
        void *lib = dlopen(info.dli_fname, RTLD_NOW | RTLD_NOLOAD);
        for (int i = 0; lib && !found && suffix[i]; i++) {
            char name[128];
            if (strlen(symbol) + strlen(suffix[i]) >= sizeof name)
                break;
            strcpy(name, symbol);
            strcat(name, suffix[i]);
            found = dlsym(lib, name);
        }
    }
    if (status)
        *status = found ? 0 : 1;
    if (pfn)
        *pfn = found;
    return found ? CUDA_SUCCESS : 500;  // CUDA_ERROR_NOT_FOUND
}
CUresult cuGetProcAddress(const char *symbol, void **pfn, int version, unsigned long long flags)
{
    return cuGetProcAddress_v2(symbol, pfn, version, flags, NULL);
}
