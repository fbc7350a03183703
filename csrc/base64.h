/* base64.h: standard base64 with padding, decoded (the probe's driver_zip
 * and driver_pyc, in rlm.core and in rlm-keeper). Pure: no I/O. */
#ifndef RLM_BASE64_H
#define RLM_BASE64_H

#include "unit.h"

#include <stddef.h>

/* Decodes s[0..len) into out, which holds len / 4 * 3 bytes. Returns the
 * bytes written, or -1 when s is not base64 with its padding. */
RLM_FN long rlm_base64_decode(const char *s, size_t len, char *out);

#endif
