/* no_dlclose.c: preloaded in the sanitizer run (scripts/sanitize.sh) so that Open MPI's
 * components, which it dlopens and dlcloses at MPI_Finalize, stay mapped until exit. Their own
 * shutdown leaks then carry their library names (mca_*, libopen-pal) and lsan.supp can exempt
 * exactly those; without it the frames read "<unknown module>" and could not be told apart. */
int dlclose(void* handle) {
  (void)handle;
  return 0;
}
