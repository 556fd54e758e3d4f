#include <cstdio>
int main() { std::puts("laga: under construction"); return 0; }
