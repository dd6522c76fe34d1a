// The CPU kernels of the plugin's two ops, registered with torch's dispatcher:
//   slotwise_cpu::linear        F.linear, products of a few rows by small_gemm.c, half
//                               dtypes in float32 where torch's GEMM has no fast path
//   slotwise_cpu::paged_decode  decode attention read in place by paged_decode.c
//
// Why C++ around the C kernels: each op runs once per layer and step, 41 times in a
// decode step of the `small` preset, and a kernel written in Python costs 6 to 7 us a
// call on top of the C kernel (the dispatcher calling back into Python, the argument
// checks, ctypes); here the checks cost nanoseconds and the call goes straight from the
// dispatcher to the kernel.  The schemas are defined in Python (slotwise_cpu/linear.py,
// slotwise_cpu/paged_decode.py), so that they exist when this library cannot be built.
#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/ops/empty.h>
#include <ATen/ops/linear.h>
#include <torch/library.h>

#include <optional>

#include "kernels.h"

namespace {

// The kernels' dtype codes (csrc/scalars.h), or -1 for a dtype they do not take.
int dtype_code(at::ScalarType dtype) {
    switch (dtype) {
        case at::kFloat: return 0;
        case at::kBFloat16: return 1;
        case at::kHalf: return 2;
        default: return -1;
    }
}

// The most rows for which the small GEMM beat torch's GEMM (small_gemm.c says where,
// docs/benchmarks.md by how much): none on a CPU with neither AVX-512 nor AVX2, where the
// kernel has only scalar code; with AVX2 alone, every dtype up to 16 rows (1.7x to 5.5x
// torch's GEMM on AMD's Zen 3, one run); with AVX-512, in float32 and float16 up to its
// limit of 16 rows (1.5x MKL in float32 at 8 and 16 rows, 1.1x to 1.2x oneDNN in float16
// at 12 and 16); in bfloat16 up to 16 rows on AMX tiles and with AVX512-BF16 on a CPU
// without AMX (1.6x torch at 16 rows on AMD's Zen 4), else up to 4 (on an Intel CPU
// refused its tiles the vector code is bound by arithmetic from there, where oneDNN ties
// at 8 and wins at 12).
int64_t max_kernel_rows(int code) { return code < 0 ? 0 : slotwise_small_gemm_rows(code); }

// torch's answer to a question op taking nothing (true where the op is missing).
bool torch_says(const char *op) {
    const auto handle = c10::Dispatcher::singleton().findSchema({op, ""});
    return !handle.has_value() || handle->typed<bool()>().call();
}

// Whether torch's GEMM has a fast path in this dtype on this CPU.  Its bfloat16 and
// float16 GEMMs are oneDNN's, where oneDNN takes the dtype (torch says where); elsewhere
// (a CPU without AVX-512, for one) torch multiplies in a generic loop, 6x to 8x slower
// than widening both operands to float32 and rounding the product once (AMD's Zen 2, 20 to
// 512 rows by 512 x 1536, one thread, one run), which is what oneDNN's half GEMMs compute.
bool torch_gemm_is_fast(at::ScalarType dtype) {
    static const bool bfloat16 = torch_says("mkldnn::_is_mkldnn_bf16_supported");
    static const bool float16 = torch_says("mkldnn::_is_mkldnn_fp16_supported");
    return dtype == at::kBFloat16 ? bfloat16 : dtype == at::kHalf ? float16 : true;
}

// F.linear by torch, in float32 where torch has no fast GEMM in the operands' dtype.
at::Tensor torch_linear(const at::Tensor &x, const at::Tensor &weight,
                        const std::optional<at::Tensor> &bias) {
    const at::ScalarType dtype = x.scalar_type();
    const bool same_dtype = weight.scalar_type() == dtype &&
                            (!bias.has_value() || bias->scalar_type() == dtype);
    if (!same_dtype || torch_gemm_is_fast(dtype)) return at::linear(x, weight, bias);
    std::optional<at::Tensor> wide_bias;
    if (bias.has_value()) wide_bias = bias->to(at::kFloat);
    return at::linear(x.to(at::kFloat), weight.to(at::kFloat), wide_bias).to(dtype);
}

at::Tensor linear(const at::Tensor &x, const at::Tensor &weight,
                  const std::optional<at::Tensor> &bias) {
    const int code = dtype_code(x.scalar_type());
    const bool kernel_takes_it =
        code >= 0 && x.dim() == 2 && x.size(0) <= max_kernel_rows(code) &&
        weight.dim() == 2 && weight.scalar_type() == x.scalar_type() &&
        x.size(1) == weight.size(1) && x.size(1) > 0 && x.stride(1) == 1 &&
        weight.is_contiguous() &&
        (!bias.has_value() ||
         (bias->scalar_type() == x.scalar_type() && bias->is_contiguous() &&
          bias->dim() == 1 && bias->size(0) == weight.size(0)));
    if (!kernel_takes_it) return torch_linear(x, weight, bias);
    const int64_t rows = x.size(0), outputs = weight.size(0), inner = x.size(1);
    at::Tensor out = at::empty({rows, outputs}, x.options());
    const int status = slotwise_small_gemm(
        x.data_ptr(), x.stride(0), weight.data_ptr(),
        bias.has_value() ? bias->data_ptr() : nullptr, out.data_ptr(), outputs, rows, outputs,
        inner, code, at::get_num_threads());
    TORCH_CHECK(status != 2, "slotwise_cpu.linear: out of memory for the float32 copy of x (",
                rows, "x", inner, ") that the AVX2 kernel reads");
    TORCH_CHECK_VALUE(status == 0, "slotwise_cpu.linear: the kernel refused ", rows, "x", inner,
                      " @ ", inner, "x", outputs);
    return out;
}

bool heads_contiguous(const at::Tensor &t, int64_t head_size) {
    return t.dim() == 3 && t.stride(2) == 1 && t.stride(1) == head_size;
}

// The layouts the kernel reads through raw pointers; anything else would read the wrong
// memory rather than fail.  Block ids, slots and lengths the kernel checks itself.
void check_layouts(const at::Tensor &q, const at::Tensor &kv_cache, const at::Tensor &block_table,
                   const at::Tensor &seq_lens, const at::Tensor &out,
                   const std::optional<at::Tensor> &new_keys,
                   const std::optional<at::Tensor> &new_values,
                   const std::optional<at::Tensor> &slot_mapping) {
    TORCH_CHECK_VALUE(
        dtype_code(kv_cache.scalar_type()) >= 0 && kv_cache.dim() == 5 && kv_cache.size(0) == 2 &&
            kv_cache.is_contiguous() && kv_cache.device().is_cpu(),
        "paged_decode: needs a contiguous CPU KV cache [2, num_blocks, num_kv_heads, "
        "block_size, head_size] (keys, then values) of float32, bfloat16 or float16; got ",
        kv_cache.scalar_type(), " ", kv_cache.sizes(), " strides ", kv_cache.strides());
    // A cache in the core's token-major layout has the same rank; its block size then
    // reads as the key/value heads.
    TORCH_CHECK_VALUE(
        q.dim() != 3 || (kv_cache.size(2) > 0 && q.size(1) % kv_cache.size(2) == 0),
        "paged_decode: the KV cache [2, num_blocks, num_kv_heads, block_size, head_size] ",
        kv_cache.sizes(), " has ", kv_cache.size(2), " key/value heads, which do not divide "
        "the query's ", q.size(1), "; a cache in the token-major layout [2, num_blocks, "
        "block_size, num_kv_heads, head_size] is not this op's (allocate it with CPU_SDPA's "
        "get_kv_cache_shape)");
    const int64_t head_size = q.dim() == 3 ? q.size(2) : -1;
    const bool with_new = new_keys.has_value() || new_values.has_value() ||
                          slot_mapping.has_value();
    bool ok = heads_contiguous(q, head_size) && q.device().is_cpu() &&
              out.scalar_type() == q.scalar_type() && out.sizes() == q.sizes() &&
              heads_contiguous(out, head_size) && out.device().is_cpu() &&
              kv_cache.scalar_type() == q.scalar_type() && kv_cache.size(4) == head_size &&
              block_table.scalar_type() == at::kInt && block_table.dim() == 2 &&
              block_table.stride(1) == 1 && block_table.size(0) >= q.size(0) &&
              block_table.device().is_cpu() && seq_lens.scalar_type() == at::kInt &&
              seq_lens.dim() == 1 && seq_lens.size(0) == q.size(0) &&
              seq_lens.is_contiguous() && seq_lens.device().is_cpu();
    if (ok && with_new) {
        ok = new_keys.has_value() && new_values.has_value() && slot_mapping.has_value();
        if (ok) {
            const at::Tensor &keys = *new_keys, &values = *new_values, &slots = *slot_mapping;
            const int64_t kv_heads = kv_cache.size(2);
            ok = keys.scalar_type() == q.scalar_type() &&
                 values.scalar_type() == q.scalar_type() && heads_contiguous(keys, head_size) &&
                 heads_contiguous(values, head_size) && keys.size(1) == kv_heads &&
                 values.size(1) == kv_heads && keys.device().is_cpu() &&
                 values.device().is_cpu() && slots.scalar_type() == at::kLong &&
                 slots.dim() == 1 && slots.is_contiguous() && slots.device().is_cpu() &&
                 keys.size(0) == slots.size(0) && values.size(0) == slots.size(0);
        }
    }
    TORCH_CHECK_VALUE(
        ok,
        "paged_decode: needs CPU tensors of the cache's dtype and head size, heads "
        "contiguous in q, out and the new keys and values (all three or none), an int32 "
        "block table with contiguous rows, int32 seq_lens (one per query) and int64 slots; "
        "got q ",
        q.scalar_type(), " ", q.sizes(), " strides ", q.strides(), ", out ", out.scalar_type(),
        " ", out.sizes(), " strides ", out.strides(), ", KV cache ", kv_cache.scalar_type(),
        " ", kv_cache.sizes(), ", block table ", block_table.scalar_type(), ", seq_lens ",
        seq_lens.scalar_type());
}

const char *status_message(int status) {
    switch (status) {
        case 1: return "bad sizes (heads not a multiple of key/value heads, or an empty dimension)";
        case 2: return "a block id or slot outside the cache, or a sequence longer than its "
                       "block table row";
        case 3: return "out of memory for the partitions' partial results";
        default: return "unknown status";
    }
}

void paged_decode(const at::Tensor &q, const at::Tensor &kv_cache, const at::Tensor &block_table,
                  const at::Tensor &seq_lens, const at::Tensor &out, double scale,
                  const std::optional<at::Tensor> &new_keys,
                  const std::optional<at::Tensor> &new_values,
                  const std::optional<at::Tensor> &slot_mapping) {
    check_layouts(q, kv_cache, block_table, seq_lens, out, new_keys, new_values, slot_mapping);
    const bool with_new = new_keys.has_value();
    char *keys = static_cast<char *>(kv_cache.data_ptr());
    char *values = keys + kv_cache.numel() / 2 * kv_cache.element_size();
    const int status = slotwise_paged_decode(
        q.data_ptr(), q.stride(0), q.stride(1), keys, values, kv_cache.size(1),
        kv_cache.stride(1), kv_cache.stride(3), kv_cache.stride(2),
        block_table.data_ptr<int32_t>(), block_table.stride(0), block_table.size(1),
        seq_lens.data_ptr<int32_t>(), out.data_ptr(), out.stride(0), out.stride(1), q.size(0),
        q.size(1), kv_cache.size(2), q.size(2), kv_cache.size(3), static_cast<float>(scale),
        dtype_code(q.scalar_type()), at::get_num_threads(),
        with_new ? new_keys->data_ptr() : nullptr, with_new ? new_keys->stride(0) : 0,
        with_new ? new_values->data_ptr() : nullptr, with_new ? new_values->stride(0) : 0,
        with_new ? slot_mapping->data_ptr<int64_t>() : nullptr,
        with_new ? slot_mapping->size(0) : 0);
    TORCH_CHECK_VALUE(status == 0, "paged_decode: ", status_message(status));
}

}  // namespace

// For slotwise_cpu.linear.max_kernel_rows: the rule above is written only here.
extern "C" int64_t slotwise_cpu_max_kernel_rows(int dtype_code) {
    return max_kernel_rows(dtype_code);
}

TORCH_LIBRARY_IMPL(slotwise_cpu, CPU, m) {
    m.impl("linear", &linear);
    m.impl("paged_decode", &paged_decode);
}
