#include "pickle_writer.hpp"

#include <cstring>

namespace ddp::pickle {

namespace {

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int j = 0; j < bytes; ++j) out.push_back(static_cast<char>((v >> (8 * j)) & 0xff));
}

}  // namespace

Writer::Writer() {
  out_.push_back('\x80');  // PROTO 2
  out_.push_back('\x02');
}

void Writer::none() {
  out_.push_back('N');
}

void Writer::boolean(bool v) {
  out_.push_back(v ? '\x88' : '\x89');
}

void Writer::integer(int64_t v) {
  if (v >= 0 && v < 256) {
    out_.push_back('K');  // BININT1
    put_le(out_, static_cast<uint64_t>(v), 1);
  } else if (v >= 0 && v < 65536) {
    out_.push_back('M');  // BININT2
    put_le(out_, static_cast<uint64_t>(v), 2);
  } else if (v >= INT32_MIN && v <= INT32_MAX) {
    out_.push_back('J');  // BININT: signed 32-bit
    put_le(out_, static_cast<uint64_t>(static_cast<uint32_t>(static_cast<int32_t>(v))), 4);
  } else {
    out_.push_back('\x8a');  // LONG1: 8 bytes of two's complement, little-endian
    out_.push_back('\x08');
    put_le(out_, static_cast<uint64_t>(v), 8);
  }
}

void Writer::real(double v) {
  out_.push_back('G');  // BINFLOAT: big-endian IEEE 754
  uint64_t bits;
  std::memcpy(&bits, &v, sizeof bits);
  for (int j = 7; j >= 0; --j) out_.push_back(static_cast<char>((bits >> (8 * j)) & 0xff));
}

void Writer::str(const std::string& v) {
  out_.push_back('X');  // BINUNICODE: 4-byte length, UTF-8
  put_le(out_, v.size(), 4);
  out_ += v;
}

void Writer::global(const std::string& module, const std::string& name) {
  out_.push_back('c');
  out_ += module;
  out_.push_back('\n');
  out_ += name;
  out_.push_back('\n');
}

void Writer::mark() {
  out_.push_back('(');
}
void Writer::tuple_from_mark() {
  out_.push_back('t');
}
void Writer::empty_tuple() {
  out_.push_back(')');
}
void Writer::empty_list() {
  out_.push_back(']');
}
void Writer::appends_from_mark() {
  out_.push_back('e');
}
void Writer::empty_dict() {
  out_.push_back('}');
}
void Writer::setitems_from_mark() {
  out_.push_back('u');
}
void Writer::newobj() {
  out_.push_back('\x81');
}
void Writer::reduce() {
  out_.push_back('R');
}
void Writer::build() {
  out_.push_back('b');
}

std::string Writer::finish() {
  out_.push_back('.');
  return std::move(out_);
}

}  // namespace ddp::pickle
