// A real third-party kernel under the plugin ABI: oneDNN's softmax (softmax_v2_forward,
// softmax_accurate) in f32 and bf16. Built when oneDNN (Debian's libdnnl-dev) is found;
// `sharpcheck gate --plugin libonednn_plugin.so` judges it like any built-in kernel.
#include <cstring>
#include <oneapi/dnnl/dnnl.hpp>

#include "kernels/plugin_abi.h"

namespace {

// oneDNN's softmax for a data type, or an exception where this CPU has none.
dnnl::softmax_v2_forward::primitive_desc softmax_for(const dnnl::engine& engine, dnnl::memory::data_type type,
                                                     size_t rows, size_t n) {
  const dnnl::memory::desc layout({static_cast<dnnl::memory::dim>(rows), static_cast<dnnl::memory::dim>(n)},
                                  type, dnnl::memory::format_tag::ab);
  const dnnl::softmax_v2_forward::desc operation(dnnl::prop_kind::forward_inference,
                                                 dnnl::algorithm::softmax_accurate, layout, layout, 1);
  return {operation, engine};
}

// bf16 only where oneDNN implements it on this CPU (not on AVX2-only machines, where every bf16
// call failed and the gate reported 88 plugin errors): a format the plugin declares must run.
uint32_t supported_formats() {
  try {
    const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    (void)softmax_for(engine, dnnl::memory::data_type::bf16, 1, 16);
    return SHARPCHECK_FP32 | SHARPCHECK_BF16;
  } catch (const dnnl::error&) {
    return SHARPCHECK_FP32;
  }
}

}  // namespace

extern "C" const sharpcheck_plugin_description* sharpcheck_plugin_info() {
  static const sharpcheck_plugin_description description{
      SHARPCHECK_PLUGIN_ABI_VERSION, "onednn", "oneDNN 2.6 softmax_v2_forward, softmax_accurate, on the CPU",
      supported_formats(), 0};
  return &description;
}

extern "C" int sharpcheck_softmax(uint32_t format, const void* logits, void* out, size_t rows, size_t n,
                                  float scale) {
  if (scale != 1.0F) return 3;  // oneDNN 2.6's softmax has no temperature; the gate runs at theta = 1
  try {
    const auto type =
        format == SHARPCHECK_FP32 ? dnnl::memory::data_type::f32 : dnnl::memory::data_type::bf16;
    if (format != SHARPCHECK_FP32 && format != SHARPCHECK_BF16) return 1;
    const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
    dnnl::stream stream(engine);
    const auto descriptor = softmax_for(engine, type, rows, n);
    const dnnl::memory::desc layout = descriptor.dst_desc();
    const dnnl::softmax_v2_forward primitive(descriptor);
    dnnl::memory source(layout, engine, const_cast<void*>(logits));
    dnnl::memory destination(layout, engine, out);
    primitive.execute(stream, {{DNNL_ARG_SRC, source}, {DNNL_ARG_DST, destination}});
    stream.wait();
  } catch (const dnnl::error&) {
    return 2;
  }
  return 0;
}
