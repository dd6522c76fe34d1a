// "foreign": a PyTorch device that is neither cpu nor cuda, for slotwise's own tests.
//
// A PrivateUse1 backend whose memory is host memory, so every op the backend does not
// implement runs through torch's boxed CPU fallback.  Code that assumes "cpu" or
// "cuda" meets a third device type here: tensors report device "foreign:N", copies to
// and from the host go through _copy_from, a generator of the device is its own
// (seeded apart from the CPU's), and each of FOREIGN_DEVICES devices (2 if unset) has
// its own current-device, stream and memory bookkeeping.  The Python side
// (torch_package/, installed as foreign_torch) renames PrivateUse1 to "foreign" and
// registers torch.foreign; the ops of the namespace foreign_device are its runtime calls.

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/EmptyTensor.h>
#include <ATen/core/GeneratorForPrivateuseone.h>
#include <ATen/detail/PrivateUse1HooksInterface.h>
#include <ATen/native/CPUFallback.h>
#include <ATen/ops/as_strided_native.h>
#include <ATen/ops/view_native.h>
#include <ATen/ops/_reshape_alias_native.h>
#include <c10/core/Allocator.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>
#include <torch/library.h>

#include <array>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>

namespace foreign {

constexpr c10::DeviceType kForeign = c10::DeviceType::PrivateUse1;
constexpr int kMaxDevices = 16;

// -- devices ----------------------------------------------------------------------

c10::DeviceIndex device_count() {
  static const c10::DeviceIndex count = [] {
    const char* value = std::getenv("FOREIGN_DEVICES");
    int parsed = value && *value ? std::atoi(value) : 2;
    return static_cast<c10::DeviceIndex>(std::max(0, std::min(parsed, kMaxDevices)));
  }();
  return count;
}

thread_local c10::DeviceIndex current = 0;

void check_index(c10::DeviceIndex index) {
  TORCH_CHECK(
      index >= 0 && index < device_count(), "foreign device ", static_cast<int>(index),
      " does not exist; there are ", static_cast<int>(device_count()),
      " (FOREIGN_DEVICES)");
}

void set_device(c10::DeviceIndex index) {
  check_index(index);
  current = index;
}

// -- memory: host memory, accounted per device --------------------------------------

struct Block {
  size_t size;
  c10::DeviceIndex device;
};

std::mutex memory_mutex;
std::unordered_map<void*, Block> blocks;
std::array<std::atomic<int64_t>, kMaxDevices> allocated{};

void release(void* ptr) {
  if (ptr == nullptr) {
    return;
  }
  {
    std::lock_guard<std::mutex> lock(memory_mutex);
    auto it = blocks.find(ptr);
    TORCH_INTERNAL_ASSERT(it != blocks.end(), "foreign: freeing memory it never allocated");
    allocated[it->second.device] -= static_cast<int64_t>(it->second.size);
    blocks.erase(it);
  }
  std::free(ptr);
}

struct ForeignAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    const c10::DeviceIndex device = current;
    void* data = nullptr;
    if (nbytes > 0) {
      // 64-byte alignment, as the CPU allocator gives, for the fallback's kernels.
      TORCH_CHECK(
          posix_memalign(&data, 64, nbytes) == 0, "foreign device ", static_cast<int>(device),
          " is out of memory allocating ", nbytes, " bytes");
      std::lock_guard<std::mutex> lock(memory_mutex);
      blocks[data] = Block{nbytes, device};
      allocated[device] += static_cast<int64_t>(nbytes);
    }
    return {data, data, &release, c10::Device(kForeign, device)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &release;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

ForeignAllocator allocator;

// Page-locked host memory, as torch asks for the CPU side of non_blocking copies: plain
// host memory here, remembered so that is_pinned() can tell it from pageable memory.
std::mutex pinned_mutex;
std::map<const char*, size_t> pinned_blocks;  // start -> size

void release_pinned(void* ptr) {
  if (ptr == nullptr) {
    return;
  }
  {
    std::lock_guard<std::mutex> lock(pinned_mutex);
    pinned_blocks.erase(static_cast<const char*>(ptr));
  }
  std::free(ptr);
}

struct PinnedAllocator final : c10::Allocator {
  c10::DataPtr allocate(size_t nbytes) override {
    void* data = nullptr;
    if (nbytes > 0) {
      TORCH_CHECK(posix_memalign(&data, 64, nbytes) == 0, "foreign: out of pinned host memory");
      std::lock_guard<std::mutex> lock(pinned_mutex);
      pinned_blocks[static_cast<const char*>(data)] = nbytes;
    }
    return {data, data, &release_pinned, c10::Device(c10::kCPU)};
  }

  c10::DeleterFnPtr raw_deleter() const override {
    return &release_pinned;
  }

  void copy_data(void* dest, const void* src, std::size_t count) const override {
    std::memcpy(dest, src, count);
  }
};

PinnedAllocator pinned_allocator;

bool is_pinned(const void* ptr) {
  const char* address = static_cast<const char*>(ptr);
  std::lock_guard<std::mutex> lock(pinned_mutex);
  auto after = pinned_blocks.upper_bound(address);
  if (after == pinned_blocks.begin()) {
    return false;
  }
  auto block = std::prev(after);
  return address < block->first + block->second;
}

c10::Device device_of_pointer(const void* ptr) {
  std::lock_guard<std::mutex> lock(memory_mutex);
  auto it = blocks.find(const_cast<void*>(ptr));
  TORCH_CHECK(it != blocks.end(), "foreign: the pointer is not foreign device memory");
  return c10::Device(kForeign, it->second.device);
}

// -- random numbers: one generator per device, wrapping a CPU generator ----------------

// The CPU fallback runs the CPU's kernels, which draw from a CPU generator; the
// device's generator keeps one and hands it to them (see fallback below).
struct ForeignGenerator final : c10::GeneratorImpl {
  explicit ForeignGenerator(c10::DeviceIndex index)
      : c10::GeneratorImpl(c10::Device(kForeign, index), c10::DispatchKeySet(c10::DispatchKey::PrivateUse1)),
        host(at::detail::createCPUGenerator()) {}

  void set_current_seed(uint64_t seed) override {
    host.set_current_seed(seed);
  }
  void set_offset(uint64_t offset) override {
    host.set_offset(offset);
  }
  uint64_t get_offset() const override {
    return host.get_offset();
  }
  uint64_t current_seed() const override {
    return host.current_seed();
  }
  uint64_t seed() override {
    return host.seed();
  }
  void set_state(const c10::TensorImpl& state) override {
    host.unsafeGetGeneratorImpl()->set_state(state);
  }
  c10::intrusive_ptr<c10::TensorImpl> get_state() const override {
    return host.unsafeGetGeneratorImpl()->get_state();
  }

  at::Generator host;

 private:
  ForeignGenerator* clone_impl() const override {
    auto* copy = new ForeignGenerator(device().index());
    copy->host = host.clone();
    return copy;
  }
};

const at::Generator& default_generator(c10::DeviceIndex index) {
  static std::array<at::Generator, kMaxDevices> generators;
  static std::once_flag once;
  std::call_once(once, [] {
    for (c10::DeviceIndex i = 0; i < device_count(); ++i) {
      generators[i] = at::make_generator<ForeignGenerator>(i);
      generators[i].set_current_seed(c10::detail::getNonDeterministicRandom());
    }
  });
  check_index(index);
  return generators[index];
}

at::Generator host_generator(const at::Generator& generator) {
  return static_cast<ForeignGenerator*>(generator.unsafeGetGeneratorImpl())->host;
}

// -- streams and events: work runs at once, so they only keep their bookkeeping ---------

thread_local std::array<c10::StreamId, kMaxDevices> current_streams{};
std::atomic<c10::StreamId> next_stream{1};

struct Event {
  std::chrono::steady_clock::time_point recorded;
};

// A stream's device with its index filled in: torch.Stream("foreign") asks for index -1.
c10::Device indexed(c10::Device device) {
  return device.has_index() ? device : c10::Device(kForeign, current);
}

struct ForeignGuardImpl final : c10::impl::DeviceGuardImplInterface {
  c10::DeviceType type() const override {
    return kForeign;
  }
  c10::Device exchangeDevice(c10::Device device) const override {
    c10::Device previous = getDevice();
    if (device.index() != previous.index()) {
      set_device(device.index());
    }
    return previous;
  }
  c10::Device getDevice() const override {
    return c10::Device(kForeign, current);
  }
  void setDevice(c10::Device device) const override {
    set_device(device.index());
  }
  void uncheckedSetDevice(c10::Device device) const noexcept override {
    current = device.index();
  }
  c10::Stream getStream(c10::Device device) const override {
    device = indexed(device);
    check_index(device.index());
    return c10::Stream(c10::Stream::UNSAFE, device, current_streams[device.index()]);
  }
  c10::Stream getNewStream(c10::Device device, int priority) const override {
    device = indexed(device);
    check_index(device.index());
    return c10::Stream(c10::Stream::UNSAFE, device, next_stream++);
  }
  c10::Stream getStreamFromGlobalPool(c10::Device device, bool high_priority) const override {
    return getNewStream(device, 0);
  }
  c10::Stream exchangeStream(c10::Stream stream) const override {
    c10::Stream previous = getStream(stream.device());
    current_streams[previous.device_index()] = stream.id();
    return previous;
  }
  c10::DeviceIndex deviceCount() const noexcept override {
    return device_count();
  }
  void record(void** event, const c10::Stream& stream, const c10::DeviceIndex device_index,
              const c10::EventFlag flag) const override {
    if (*event == nullptr) {
      *event = new Event();
    }
    static_cast<Event*>(*event)->recorded = std::chrono::steady_clock::now();
  }
  void destroyEvent(void* event, const c10::DeviceIndex device_index) const noexcept override {
    delete static_cast<Event*>(event);
  }
  void block(void* event, const c10::Stream& stream) const override {}
  bool queryEvent(void* event) const override {
    return true;
  }
  void synchronizeEvent(void* event) const override {}
  double elapsedTime(void* start, void* end, const c10::DeviceIndex device_index) const override {
    TORCH_CHECK(start && end, "foreign: both events must be recorded before elapsed_time");
    std::chrono::duration<double, std::milli> span =
        static_cast<Event*>(end)->recorded - static_cast<Event*>(start)->recorded;
    return span.count();
  }
  bool queryStream(const c10::Stream& stream) const override {
    return true;
  }
  void synchronizeStream(const c10::Stream& stream) const override {}
  void synchronizeDevice(const c10::DeviceIndex device_index) const override {}
};

C10_REGISTER_GUARD_IMPL(PrivateUse1, ForeignGuardImpl);

// -- what torch asks the backend through its hooks -----------------------------------

struct ForeignHooks final : at::PrivateUse1HooksInterface {
  bool isBuilt() const override {
    return true;
  }
  bool isAvailable() const override {
    return device_count() > 0;
  }
  bool hasPrimaryContext(c10::DeviceIndex device_index) const override {
    return true;
  }
  c10::DeviceIndex deviceCount() const override {
    return device_count();
  }
  void setCurrentDevice(c10::DeviceIndex device) const override {
    set_device(device);
  }
  c10::DeviceIndex getCurrentDevice() const override {
    return current;
  }
  c10::DeviceIndex exchangeDevice(c10::DeviceIndex device) const override {
    c10::DeviceIndex previous = current;
    set_device(device);
    return previous;
  }
  c10::DeviceIndex maybeExchangeDevice(c10::DeviceIndex device) const override {
    return exchangeDevice(device);
  }
  const at::Generator& getDefaultGenerator(c10::DeviceIndex device_index) const override {
    return default_generator(device_index < 0 ? current : device_index);
  }
  at::Generator getNewGenerator(c10::DeviceIndex device_index) const override {
    c10::DeviceIndex index = device_index < 0 ? current : device_index;
    check_index(index);
    return at::make_generator<ForeignGenerator>(index);
  }
  bool isPinnedPtr(const void* data) const override {
    return is_pinned(data);
  }
  at::Allocator* getPinnedMemoryAllocator() const override {
    return &pinned_allocator;
  }
  at::Device getDeviceFromPtr(void* data) const override {
    return device_of_pointer(data);
  }
  void resizePrivateUse1Bytes(const c10::Storage& storage, size_t nbytes) const override {
    c10::StorageImpl* impl = storage.unsafeGetStorageImpl();
    TORCH_CHECK(impl->resizable(), "foreign: this storage is not resizable");
    c10::DeviceGuard guard(storage.device());
    c10::DataPtr data = allocator.allocate(nbytes);
    size_t kept = std::min(nbytes, impl->nbytes());
    if (kept > 0) {
      std::memcpy(data.get(), impl->data(), kept);
    }
    impl->set_data_ptr_noswap(std::move(data));
    impl->set_nbytes(nbytes);
  }
};

ForeignHooks hooks;

// -- the aten ops a backend must implement itself ------------------------------------

c10::Device target_device(std::optional<c10::Device> device) {
  c10::Device chosen = device.value_or(c10::Device(kForeign, current));
  TORCH_CHECK(chosen.type() == kForeign, "foreign: asked to allocate on ", chosen);
  return chosen.has_index() ? chosen : c10::Device(kForeign, current);
}

at::Tensor empty_memory_format(c10::SymIntArrayRef size, std::optional<c10::ScalarType> dtype,
                               std::optional<c10::Layout> layout, std::optional<c10::Device> device,
                               std::optional<bool> pin_memory,
                               std::optional<c10::MemoryFormat> memory_format) {
  TORCH_CHECK(layout.value_or(c10::kStrided) == c10::kStrided, "foreign: strided tensors only");
  c10::DeviceGuard guard(target_device(device));
  return at::detail::empty_generic(
      C10_AS_INTARRAYREF_SLOW(size), &allocator, c10::DispatchKeySet(c10::DispatchKey::PrivateUse1),
      c10::dtype_or_default(dtype), memory_format);
}

at::Tensor empty_strided(c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                         std::optional<c10::ScalarType> dtype, std::optional<c10::Layout> layout,
                         std::optional<c10::Device> device, std::optional<bool> pin_memory) {
  TORCH_CHECK(layout.value_or(c10::kStrided) == c10::kStrided, "foreign: strided tensors only");
  c10::DeviceGuard guard(target_device(device));
  return at::detail::empty_strided_generic(
      C10_AS_INTARRAYREF_SLOW(size), C10_AS_INTARRAYREF_SLOW(stride), &allocator,
      c10::DispatchKeySet(c10::DispatchKey::PrivateUse1), c10::dtype_or_default(dtype));
}

// A CPU tensor over the same bytes: host memory makes every copy a CPU copy.
at::Tensor host_view(const at::Tensor& tensor) {
  if (tensor.device().is_cpu()) {
    return tensor;
  }
  return at::from_blob(tensor.data_ptr(), tensor.sizes(), tensor.strides(),
                       tensor.options().device(c10::kCPU));
}

at::Tensor copy_from(const at::Tensor& self, const at::Tensor& dst, bool non_blocking) {
  TORCH_CHECK(self.sizes() == dst.sizes(), "foreign: _copy_from between shapes ", self.sizes(),
              " and ", dst.sizes());
  if (dst.numel() > 0) {
    host_view(dst).copy_(host_view(self));
  }
  return dst;
}

const at::Tensor& resize_(const at::Tensor& self, c10::SymIntArrayRef size,
                          std::optional<c10::MemoryFormat> memory_format) {
  at::IntArrayRef sizes = C10_AS_INTARRAYREF_SLOW(size);
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  if (self.sizes() == sizes && !memory_format.has_value()) {
    return self;  // as on the CPU: a view written through (the fallback's out=) keeps its strides
  }
  impl->set_sizes_contiguous(sizes);
  const size_t needed = at::detail::computeStorageNbytesContiguous(
      sizes, self.dtype().itemsize(), self.storage_offset());
  if (needed > self.storage().nbytes()) {
    hooks.resizePrivateUse1Bytes(self.storage(), needed);
  }
  if (memory_format.has_value()) {
    TORCH_CHECK(*memory_format != c10::MemoryFormat::Preserve,
                "foreign: resize_ cannot preserve a memory format");
    impl->empty_tensor_restride(*memory_format);
  }
  return self;
}

at::Tensor copy_from_and_resize(const at::Tensor& self, const at::Tensor& dst) {
  resize_(dst, self.sym_sizes(), std::nullopt);
  return copy_from(self, dst, false);
}

at::Scalar local_scalar_dense(const at::Tensor& self) {
  return host_view(self).item();
}

at::Tensor as_strided(const at::Tensor& self, c10::SymIntArrayRef size, c10::SymIntArrayRef stride,
                      std::optional<c10::SymInt> storage_offset) {
  std::optional<int64_t> offset;
  if (storage_offset.has_value()) {
    offset = storage_offset->guard_int(__FILE__, __LINE__);
  }
  return at::native::as_strided_tensorimpl(self, C10_AS_INTARRAYREF_SLOW(size),
                                           C10_AS_INTARRAYREF_SLOW(stride), offset);
}

at::Tensor view(const at::Tensor& self, c10::SymIntArrayRef size) {
  return at::native::view(self, C10_AS_INTARRAYREF_SLOW(size));
}

at::Tensor reshape_alias(const at::Tensor& self, c10::SymIntArrayRef size,
                         c10::SymIntArrayRef stride) {
  return at::native::_reshape_alias(self, C10_AS_INTARRAYREF_SLOW(size),
                                    C10_AS_INTARRAYREF_SLOW(stride));
}

at::Tensor& set_storage(at::Tensor& self, c10::Storage source, c10::SymInt storage_offset,
                        c10::SymIntArrayRef size, c10::SymIntArrayRef stride) {
  TORCH_CHECK(source.device().type() == kForeign, "foreign: set_ to a storage on ",
              source.device());
  at::IntArrayRef sizes = C10_AS_INTARRAYREF_SLOW(size);
  c10::TensorImpl* impl = self.unsafeGetTensorImpl();
  impl->set_storage_keep_dtype(std::move(source));
  if (stride.empty()) {
    impl->set_sizes_contiguous(sizes);
    impl->set_storage_offset(storage_offset.guard_int(__FILE__, __LINE__));
  } else {
    impl->set_sizes_and_strides(sizes, C10_AS_INTARRAYREF_SLOW(stride),
                                storage_offset.guard_int(__FILE__, __LINE__));
  }
  return self;
}

at::Tensor& set_source_tensor(at::Tensor& self, const at::Tensor& source) {
  return set_storage(self, source.storage(), source.sym_storage_offset(), source.sym_sizes(),
                     source.sym_strides());
}

at::Tensor& set_source_storage(at::Tensor& self, c10::Storage source) {
  const int64_t numel = static_cast<int64_t>(source.nbytes() / self.dtype().itemsize());
  return set_storage(self, std::move(source), 0, {numel}, {1});
}

// Every other op runs on the CPU.  An op drawing random numbers gets the CPU generator
// inside the device's generator: the one passed, or the default one of the device of
// its first foreign tensor, so the device's seed (not the CPU's) decides its numbers.
void fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack) {
  const auto& arguments = op.schema().arguments();
  const size_t first = stack->size() - arguments.size();
  std::optional<c10::DeviceIndex> device;
  for (size_t i = 0; i < arguments.size() && !device; ++i) {
    const c10::IValue& value = (*stack)[first + i];
    if (value.isTensor() && value.toTensor().device().type() == kForeign) {
      device = value.toTensor().device().index();
    }
  }
  for (size_t i = 0; i < arguments.size(); ++i) {
    c10::TypePtr type = arguments[i].real_type();
    if (auto optional = type->cast<c10::OptionalType>()) {
      type = optional->getElementType();
    }
    if (type->kind() != c10::TypeKind::GeneratorType) {
      continue;
    }
    c10::IValue& value = (*stack)[first + i];
    if (value.isGenerator() && value.toGenerator().device().type() == kForeign) {
      value = c10::IValue(host_generator(value.toGenerator()));
    } else if (value.isNone() && device) {
      value = c10::IValue(host_generator(default_generator(*device)));
    }
  }
  at::native::cpu_fallback(op, stack);
}

// -- runtime calls for the Python side (torch.ops.foreign_device.*) ------------------

int64_t runtime_device_count() {
  return device_count();
}
int64_t runtime_current_device() {
  return current;
}
void runtime_set_device(int64_t index) {
  set_device(static_cast<c10::DeviceIndex>(index));
}
int64_t runtime_memory_allocated(int64_t index) {
  check_index(static_cast<c10::DeviceIndex>(index));
  return allocated[index];
}
void runtime_manual_seed(int64_t index, int64_t seed) {
  at::Generator generator = default_generator(static_cast<c10::DeviceIndex>(index));
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_current_seed(static_cast<uint64_t>(seed));
}
int64_t runtime_initial_seed(int64_t index) {
  return static_cast<int64_t>(
      default_generator(static_cast<c10::DeviceIndex>(index)).current_seed());
}
at::Tensor runtime_get_rng_state(int64_t index) {
  at::Generator generator = default_generator(static_cast<c10::DeviceIndex>(index));
  std::lock_guard<std::mutex> lock(generator.mutex());
  return generator.get_state();
}
void runtime_set_rng_state(int64_t index, const at::Tensor& state) {
  at::Generator generator = default_generator(static_cast<c10::DeviceIndex>(index));
  std::lock_guard<std::mutex> lock(generator.mutex());
  generator.set_state(state);
}

const bool hooks_registered = [] {
  at::RegisterPrivateUse1HooksInterface(&hooks);
  c10::SetAllocator(kForeign, &allocator);
  return true;
}();

}  // namespace foreign

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) {
  m.impl("empty.memory_format", &foreign::empty_memory_format);
  m.impl("empty_strided", &foreign::empty_strided);
  m.impl("as_strided", &foreign::as_strided);
  m.impl("view", &foreign::view);
  m.impl("_reshape_alias", &foreign::reshape_alias);
  m.impl("resize_", &foreign::resize_);
  m.impl("_copy_from", &foreign::copy_from);
  m.impl("_copy_from_and_resize", &foreign::copy_from_and_resize);
  m.impl("_local_scalar_dense", &foreign::local_scalar_dense);
  m.impl("set_.source_Tensor", &foreign::set_source_tensor);
  m.impl("set_.source_Storage", &foreign::set_source_storage);
  m.impl("set_.source_Storage_storage_offset", &foreign::set_storage);
}

TORCH_LIBRARY_IMPL(_, PrivateUse1, m) {
  m.fallback(torch::CppFunction::makeFromBoxedFunction<&foreign::fallback>());
}

TORCH_LIBRARY(foreign_device, m) {
  m.def("device_count() -> int", &foreign::runtime_device_count);
  m.def("current_device() -> int", &foreign::runtime_current_device);
  m.def("set_device(int index) -> ()", &foreign::runtime_set_device);
  m.def("memory_allocated(int index) -> int", &foreign::runtime_memory_allocated);
  m.def("manual_seed(int index, int seed) -> ()", &foreign::runtime_manual_seed);
  m.def("initial_seed(int index) -> int", &foreign::runtime_initial_seed);
  m.def("get_rng_state(int index) -> Tensor", &foreign::runtime_get_rng_state);
  m.def("set_rng_state(int index, Tensor state) -> ()", &foreign::runtime_set_rng_state);
}
