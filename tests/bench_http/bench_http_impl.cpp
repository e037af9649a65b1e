// tools/ is not a library: compile the bench client into this test executable.
#include "../../tools/bench_http.cpp"
