/* SPDX-License-Identifier: Apache-2.0 */
/* placeholder: implementation in progress */
#include "airlock/transport.h"
