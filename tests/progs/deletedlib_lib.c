/* The library tests/progs/deletedlib.c loads and then deletes: a function and a table of
 * 512 KiB (128 pages) of one known value, read a page at a time, most of it never read before
 * the first checkpoint. */
#include <stdint.h>

#define TABLE_WORDS 65536
#define TABLE_VALUE 0x5a17ab1e0ddba11ULL

const uint64_t ckpt_table[TABLE_WORDS] = {[0 ... TABLE_WORDS - 1] = TABLE_VALUE};

uint64_t ckpt_lib_word(unsigned long i)
{
    return ckpt_table[i % TABLE_WORDS] ^ (uint64_t)i;
}
