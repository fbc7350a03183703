/* unit.h: rlm.core is one translation unit (csrc/rlm.c includes every other
 * C file), and every function in it is static: the module exports
 * luaopen_rlm_core alone, whatever flags the build passes (luarocks passes
 * no -fvisibility). A definition after an RLM_FN declaration is static too.
 * Plain static, not unused: a function nothing calls is a -Wunused-function
 * error in the build (-Werror), so dead code does not stay. */
#ifndef RLM_UNIT_H
#define RLM_UNIT_H

#define RLM_FN static

#endif
