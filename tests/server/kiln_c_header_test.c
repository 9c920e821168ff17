/* client/kiln_c.h is C: this file is compiled as C99 with -pedantic -Werror
 * and calls into libkiln_c.so (version, a status for a NULL out-param, NULL
 * handles). */
#include <stdio.h>
#include <string.h>

#include "client/kiln_c.h"

int main(void) {
  kiln_status* status;
  int ok = 1;
  if (kiln_c_api_version() != KILN_C_API_VERSION) ok = 0;
  status = kiln_client_create(NULL, 0, -1, NULL);
  if (kiln_status_code(status) != KILN_INVALID_ARGUMENT) ok = 0;
  if (strstr(kiln_status_message(status), "out is NULL") == NULL) ok = 0;
  kiln_status_free(status);
  kiln_client_destroy(NULL);
  if (kiln_cuda_executable_num_outputs(NULL) != 0) ok = 0;
  printf("%s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
