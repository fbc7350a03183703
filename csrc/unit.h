/* unit.h: rlm.core is one translation unit (csrc/rlm.c includes every other
 * C file), and every function in it is static: the module exports
 * luaopen_rlm_core alone, whatever flags the build passes (luarocks passes
 * no -fvisibility). A definition after an RLM_FN declaration is static too.
 * Some units' functions are used by only some includers (the fuzzer takes
 * framing.c alone): unused is not an error. */
#ifndef RLM_UNIT_H
#define RLM_UNIT_H

#define RLM_FN static __attribute__((unused))

#endif
