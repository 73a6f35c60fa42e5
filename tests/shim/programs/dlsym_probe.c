/* dlsym_probe: ordinary dynamic-linker look-ups, printed in a form that does not depend on load
 * addresses (the object each symbol was found in, its name there, dlerror afterwards), so a run
 * under LD_PRELOAD=libcuarena_preload.so can be compared line by line with a run without it.
 *
 * The shim interposes dlsym. The classic trap is RTLD_NEXT: glibc finds "the next object" from
 * the caller's return address, so a dlsym wrapper that calls the real one makes every RTLD_NEXT
 * look-up start after the shim instead of after the caller. libshim_probe_wrap.so (loaded before
 * libshim_probe_base.so, both defining probe_layer) asks dlsym(RTLD_NEXT, "probe_layer") from
 * inside itself: the answer must be base's; a wrapper that loses the caller returns wrap's own. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

const char *probe_layer(void);            /* libshim_probe_wrap.so, then libshim_probe_base.so */
void *probe_wrap_next(const char *name);  /* dlsym(RTLD_NEXT, name) called inside the wrap lib */

static const char *base_name(const char *path) {
  const char *slash = strrchr(path, '/');
  return slash ? slash + 1 : path;
}

/* Prints where p lives and what dlerror() says right after the look-up: NULL after a success
 * (a stale message left by the shim's own look-ups would show here), the message after a miss. */
static void show(const char *what, void *p) {
  const char *err = dlerror();
  if (!p) {
    printf("%s: NULL, dlerror: %s\n", what, err ? err : "(null)");
    return;
  }
  Dl_info info;
  memset(&info, 0, sizeof info);
  if (dladdr(p, &info) && info.dli_fname)
    printf("%s: found in %s as %s, dlerror: %s\n", what,
           info.dli_fname[0] ? base_name(info.dli_fname) : "(main program)",
           info.dli_sname ? info.dli_sname : "(no name)", err ? err : "(null)");
  else
    printf("%s: found, dladdr knows no object, dlerror: %s\n", what, err ? err : "(null)");
}

#define LOOKUP(what, expr) \
  do {                     \
    dlerror();             \
    void *p_ = (expr);     \
    show(what, p_);        \
  } while (0)

int main(void) {
  void *libm = dlopen("libm.so.6", RTLD_NOW | RTLD_LOCAL);
  printf("dlopen(libm.so.6): %s\n", libm ? "ok" : dlerror());
  if (libm) {
    dlerror();
    double (*cosine)(double) = (double (*)(double))dlsym(libm, "cos");
    show("dlsym(libm, cos)", (void *)cosine);
    if (cosine) printf("cos(0.5) = %.12f\n", cosine(0.5));
    LOOKUP("dlvsym(libm, cos, GLIBC_2.2.5)", dlvsym(libm, "cos", "GLIBC_2.2.5"));
    LOOKUP("dlsym(libm, printf)", dlsym(libm, "printf"));  /* a handle searches its dependencies */
    LOOKUP("dlsym(libm, cuarena_no_such_symbol)", dlsym(libm, "cuarena_no_such_symbol"));
  }

  LOOKUP("dlsym(RTLD_DEFAULT, printf)", dlsym(RTLD_DEFAULT, "printf"));
  LOOKUP("dlsym(RTLD_DEFAULT, probe_layer)", dlsym(RTLD_DEFAULT, "probe_layer"));
  LOOKUP("dlsym(RTLD_DEFAULT, cuarena_no_such_symbol)", dlsym(RTLD_DEFAULT, "cuarena_no_such_symbol"));
  LOOKUP("dlsym(RTLD_NEXT, malloc)", dlsym(RTLD_NEXT, "malloc"));
  LOOKUP("dlsym(RTLD_NEXT, probe_layer)", dlsym(RTLD_NEXT, "probe_layer"));
  LOOKUP("dlsym(RTLD_NEXT, cuarena_no_such_symbol)", dlsym(RTLD_NEXT, "cuarena_no_such_symbol"));

  void *self = dlopen(NULL, RTLD_NOW);
  printf("dlopen(NULL): %s\n", self ? "ok" : dlerror());
  if (self) {
    LOOKUP("dlsym(self, printf)", dlsym(self, "printf"));
    LOOKUP("dlsym(self, probe_layer)", dlsym(self, "probe_layer"));
  }

  /* RTLD_NEXT from inside a library: the wrap lib's next probe_layer is base's. */
  printf("probe_layer() = %s\n", probe_layer());
  dlerror();
  const char *(*next_layer)(void) = (const char *(*)(void))probe_wrap_next("probe_layer");
  show("wrap: dlsym(RTLD_NEXT, probe_layer)", (void *)next_layer);
  if (next_layer) printf("wrap: next probe_layer() = %s\n", next_layer());
  dlerror();
  show("wrap: dlsym(RTLD_NEXT, malloc)", probe_wrap_next("malloc"));
  dlerror();
  show("wrap: dlsym(RTLD_NEXT, cuarena_no_such_symbol)", probe_wrap_next("cuarena_no_such_symbol"));

  fprintf(stderr, "dlsym_probe: done\n");
  return 0;
}
