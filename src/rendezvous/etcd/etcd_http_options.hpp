#pragma once
// The HTTP client's options for an EtcdStore's settings (the store, the doctor's probes).
// Internal to src/rendezvous/etcd.

#include "ddp/rendezvous/etcd/etcd_store.hpp"
#include "etcd_http.hpp"

namespace ddp::rdzv::etcd {

inline HttpOptions http_options(const EtcdStoreOptions& o) {
  HttpOptions h;
  h.endpoints = o.endpoints;
  h.https = o.https;
  h.cacert = o.cacert;
  h.cert = o.cert;
  h.key = o.key;
  h.retry_for = o.connect_timeout;
  h.read_timeout = o.read_timeout;
  h.local_address = o.local_address;
  return h;
}

}  // namespace ddp::rdzv::etcd
