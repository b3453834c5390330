#pragma once
// Writes a Python pickle (protocol 2) op by op: enough to build DCP's `.metadata` (dataclass
// instances, torch.Size, dtypes) for Python's plain pickle.load. The caller keeps the stack
// balanced; str() and friends push one value each.

#include <cstdint>
#include <string>

namespace ddp::pickle {

class Writer {
 public:
  Writer();

  void none();
  void boolean(bool v);
  void integer(int64_t v);
  void real(double v);
  void str(const std::string& v);
  // Pushes the global module.name (a class or function; it is looked up by the reader).
  void global(const std::string& module, const std::string& name);
  void mark();
  void tuple_from_mark();  // the values since mark() become one tuple
  void empty_tuple();
  void empty_list();
  void appends_from_mark();  // appends the values since mark() to the list below the mark
  void empty_dict();
  void setitems_from_mark();  // key, value pairs since mark() into the dict below the mark
  void newobj();              // cls, args -> cls.__new__(cls, *args)
  void reduce();              // callable, args -> callable(*args)
  void build();               // obj, state -> obj with the state set
  // Ends the stream and returns it.
  std::string finish();

 private:
  std::string out_;
};

}  // namespace ddp::pickle
