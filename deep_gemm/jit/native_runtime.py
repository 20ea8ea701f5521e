"""The C runtime linked into every native library of the kernel cache (jit/native.py): NRT's allocation functions
the kernels' code calls, the stubs of numba's CPython-wrapper helpers that a native call never reaches, and the
symbol sets the link checks against. Data only.
"""

from __future__ import annotations

# NOTES: numba's generated object code references these only from the CPython wrapper numba adds beside each
# function (boxing, unboxing, raising into Python), which a native call never runs; they are defined as stubs that
# abort with a message. Any other undefined numba or NRT symbol means the kernel code itself needs numba's runtime:
# the native build is refused and the kernel keeps the numba path.
_WRAPPER_ONLY = frozenset({
    "numba_do_raise", "numba_gil_ensure", "numba_gil_release", "numba_unpickle",
    "numba_runtime_build_excinfo_struct", "NRT_adapt_ndarray_from_python", "NRT_adapt_ndarray_to_python_acqref",
    "NRT_adapt_buffer_from_python", "numba_adapt_ndarray", "numba_get_buffer", "numba_release_buffer",
    "numba_extract_record_data", "numba_recreate_record", "numba_unpack_slice", "numba_fatal_error",
    "numba_pickle", "numba_adapt_buffer", "NRT_get_api",
})
# What _RUNTIME_C defines.
_RUNTIME_SYMBOLS = frozenset({
    "NRT_Allocate", "NRT_Free", "NRT_Reallocate", "NRT_MemInfo_new", "NRT_MemInfo_alloc", "NRT_MemInfo_alloc_safe",
    "NRT_MemInfo_alloc_aligned", "NRT_MemInfo_alloc_safe_aligned", "NRT_MemInfo_call_dtor",
})

# The runtime the kernels' code calls: NRT's memory functions (numba's MemInfo layout, which the code reads
# inline: refct, dtor, dtor_info, data, size, external allocator). Our own minimal implementation; allocation
# failure returns NULL, which numba's code turns into a MemoryError status.
_RUNTIME_C = r"""
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef void (*dg_dtor)(void *data, size_t size, void *info);
typedef struct {
    size_t refct;
    dg_dtor dtor;
    void *dtor_info;
    void *data;
    size_t size;
    void *external_allocator;
    /* ours, after numba's fields: how the block was allocated, for the per-thread reuse below */
    unsigned dg_align;
    int dg_owned;
} dg_meminfo;

void *NRT_Allocate(size_t size) { return malloc(size); }
void NRT_Free(void *ptr) { free(ptr); }
void *NRT_Reallocate(void *ptr, size_t size) { return realloc(ptr, size); }

/* A kernel allocates the same per-core buffers (np.empty) for every logical core it runs and frees them at the
   core's end: each thread keeps a few freed blocks and hands them out again for the same size and alignment.
   NOTES: every native library has its own copy of this cache, so it is small (DG_REUSE_SLOTS blocks, at most
   DG_REUSE_BYTES per thread and library; a larger block is never kept) and a thread's blocks are freed when it exits
   (the pthread key's destructor), so memory stays bounded by libraries x live threads x DG_REUSE_BYTES. */
#define DG_REUSE_SLOTS 8
#define DG_REUSE_BYTES ((size_t)8 << 20)
typedef struct {
    dg_meminfo *slot[DG_REUSE_SLOTS];
    int count;
    size_t bytes;
} dg_reuse_list;
static pthread_key_t dg_reuse_key;
static int dg_reuse_ready;  /* 1: the key exists; -1: pthread_key_create failed (no reuse) */
static pthread_once_t dg_reuse_once = PTHREAD_ONCE_INIT;

static void dg_reuse_release(void *p) {
    dg_reuse_list *list = (dg_reuse_list *)p;
    for (int i = 0; i < list->count; i++) free(list->slot[i]);
    free(list);
}

static void dg_reuse_init(void) { dg_reuse_ready = pthread_key_create(&dg_reuse_key, dg_reuse_release) == 0 ? 1 : -1; }

static dg_reuse_list *dg_reuse_get(int create) {
    pthread_once(&dg_reuse_once, dg_reuse_init);
    if (dg_reuse_ready != 1) return NULL;
    dg_reuse_list *list = (dg_reuse_list *)pthread_getspecific(dg_reuse_key);
    if (list == NULL && create) {
        list = (dg_reuse_list *)calloc(1, sizeof(dg_reuse_list));
        if (list != NULL && pthread_setspecific(dg_reuse_key, list) != 0) {
            free(list);
            list = NULL;
        }
    }
    return list;
}

/* For the tests: bytes this thread keeps for reuse in this library. */
size_t dg_reuse_held(void) {
    dg_reuse_list *list = dg_reuse_get(0);
    return list == NULL ? 0 : list->bytes;
}

static dg_meminfo *dg_alloc(size_t size, unsigned align) {
    dg_reuse_list *list = dg_reuse_get(0);
    if (list != NULL) {
        for (int i = list->count - 1; i >= 0; i--) {
            dg_meminfo *mi = list->slot[i];
            if (mi->size == size && mi->dg_align == align) {
                list->slot[i] = list->slot[--list->count];
                list->bytes -= size;
                mi->refct = 1;
                return mi;
            }
        }
    }
    size_t pad = align > 1 ? align : 1;
    char *base = (char *)malloc(sizeof(dg_meminfo) + size + pad);
    if (base == NULL) return NULL;
    dg_meminfo *mi = (dg_meminfo *)base;
    uintptr_t data = (uintptr_t)(base + sizeof(dg_meminfo));
    if (align > 1 && data % align) data += align - data % align;
    mi->refct = 1;
    mi->dtor = NULL;
    mi->dtor_info = NULL;
    mi->data = (void *)data;
    mi->size = size;
    mi->external_allocator = NULL;
    mi->dg_align = align;
    mi->dg_owned = 1;
    return mi;
}

dg_meminfo *NRT_MemInfo_alloc(size_t size) { return dg_alloc(size, 1); }
dg_meminfo *NRT_MemInfo_alloc_safe(size_t size) { return dg_alloc(size, 1); }
dg_meminfo *NRT_MemInfo_alloc_aligned(size_t size, unsigned align) { return dg_alloc(size, align); }
dg_meminfo *NRT_MemInfo_alloc_safe_aligned(size_t size, unsigned align) { return dg_alloc(size, align); }

dg_meminfo *NRT_MemInfo_new(void *data, size_t size, dg_dtor dtor, void *info) {
    dg_meminfo *mi = (dg_meminfo *)malloc(sizeof(dg_meminfo));
    if (mi == NULL) return NULL;
    mi->refct = 1;
    mi->dtor = dtor;
    mi->dtor_info = info;
    mi->data = data;
    mi->size = size;
    mi->external_allocator = NULL;
    mi->dg_align = 0;
    mi->dg_owned = 0;
    return mi;
}

void NRT_MemInfo_call_dtor(dg_meminfo *mi) {
    if (mi->dtor != NULL) mi->dtor(mi->data, mi->size, mi->dtor_info);
    if (mi->dg_owned && mi->dtor == NULL && mi->size <= DG_REUSE_BYTES) {
        dg_reuse_list *list = dg_reuse_get(1);
        if (list != NULL && list->count < DG_REUSE_SLOTS && list->bytes + mi->size <= DG_REUSE_BYTES) {
            list->slot[list->count++] = mi;
            list->bytes += mi->size;
            return;
        }
    }
    free(mi);
}

static void dg_wrapper_only(const char *name) {
    fprintf(stderr, "deep_gemm native kernel: %s called outside numba (a CPython wrapper ran); aborting\n", name);
    abort();
}

/* numpy's array object, as far as the trampolines read it (the stable leading fields of PyArrayObject_fields). */
typedef struct {
    intptr_t ob_refcnt;
    void *ob_type;
    char *data;
    int nd;
    int64_t *dimensions;
    int64_t *strides;
    void *base;
    void *descr;
    int flags;
} dg_array;

/* For the loader's self-test: what the trampolines read from an array. */
int64_t dg_probe_array(dg_array *a, int64_t *out) {
    out[0] = (int64_t)(uintptr_t)a->data;
    out[1] = a->nd;
    out[2] = a->nd > 0 ? a->dimensions[0] : -1;
    out[3] = a->nd > 0 ? a->strides[0] : -1;
    out[4] = a->flags;
    return 0;
}
"""
