/* libshim_probe_base.so: the second definition of probe_layer (see dlsym_probe.c). */
const char *probe_layer(void) { return "base"; }

/* Referenced by libshim_probe_wrap.so so that its DT_NEEDED on this library survives
 * --as-needed. */
int probe_base_marker(void) { return 1; }
