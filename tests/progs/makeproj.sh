#!/bin/bash
# makeproj: `make -j2` building a small C project written into WORKDIR: eight modules and a main,
# each compile slowed by sleeps in the recipe (before and after the compiler runs, so that a
# checkpoint mostly lands in a sleep), then the built program runs and prints its RESULT.
#
# Usage: makeproj.sh WORKDIR [SECONDS=4]
set -e
echo START
dir=$1
pause=$(awk -v s="${2:-4}" 'BEGIN { printf "%.2f", s / 10 }')
mkdir -p "$dir/proj" "$dir/tmp"
cd "$dir/proj"
# The compiler's temporary files (/tmp/cc*.s) in the work directory, which the test protects: a
# checkpoint landing during a compile would otherwise leave the restart refusing for a file the
# job had open and the compiler removed since (CI saw it once in about a dozen runs).
export TMPDIR=$dir/tmp
mods=""
for k in 1 2 3 4 5 6 7 8; do
    cat > "m$k.c" <<C
unsigned long long m$k(unsigned long long x) { return x * ${k}ULL * 2654435761ULL + ${k}ULL; }
C
    mods="$mods m$k.o"
done
cat > main.c <<'C'
#include <stdio.h>
unsigned long long m1(unsigned long long), m2(unsigned long long), m3(unsigned long long),
    m4(unsigned long long), m5(unsigned long long), m6(unsigned long long),
    m7(unsigned long long), m8(unsigned long long);
int main(void)
{
    unsigned long long h = 0;
    for (unsigned long long i = 0; i < 1000; i++)
        h = m8(m7(m6(m5(m4(m3(m2(m1(h ^ i))))))));
    printf("RESULT %016llx\n", h);
    return 0;
}
C
cat > Makefile <<M
prog: main.o$mods
	\$(CC) -o \$@ \$^
%.o: %.c
	sleep $pause; \$(CC) -O2 -c -o \$@ \$<; sleep $pause
M
make -j2 > make.log 2>&1
./prog
