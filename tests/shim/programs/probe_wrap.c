/* libshim_probe_wrap.so: loaded before libshim_probe_base.so (its dependency); both define
 * probe_layer (see dlsym_probe.c). probe_wrap_next asks dlsym(RTLD_NEXT, name) from inside this
 * library. */
#define _GNU_SOURCE
#include <dlfcn.h>

int probe_base_marker(void);  /* keeps the DT_NEEDED on libshim_probe_base.so */

const char *probe_layer(void) { return probe_base_marker() ? "wrap" : "wrap?"; }

/* Counting after the call keeps it from being a tail call: a jump to dlsym would make the caller
 * of probe_wrap_next (the program) the object RTLD_NEXT is relative to. */
volatile int probe_wrap_calls;

void *probe_wrap_next(const char *name) {
  void *p = dlsym(RTLD_NEXT, name);
  probe_wrap_calls++;
  return p;
}
