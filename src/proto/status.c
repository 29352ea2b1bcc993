/* Translation between -errno and wire status, generated from STK_STATUS_TABLE. */
#include "status.h"

uint32_t stk_status_from_errno(int neg_errno)
{
	int e = neg_errno < 0 ? -neg_errno : neg_errno;

	if (e == 0)
		return STK_ST_OK;
	if (e == ENOTSUP)
		return STK_ST_NOTSUP;
#define STK_STATUS_FROM(name, code, err) \
	if (e == (err))                  \
		return code;
	STK_STATUS_TABLE(STK_STATUS_FROM)
#undef STK_STATUS_FROM
	return STK_ST_IO;
}

int stk_status_to_errno(uint32_t status)
{
	switch (status) {
#define STK_STATUS_TO(name, code, err) \
	case code:                     \
		return -(err);
		STK_STATUS_TABLE(STK_STATUS_TO)
#undef STK_STATUS_TO
	default:
		return -EIO;
	}
}

const char *stk_status_name(uint32_t status)
{
	switch (status) {
#define STK_STATUS_NAME(name, code, err) \
	case code:                       \
		return #name;
		STK_STATUS_TABLE(STK_STATUS_NAME)
#undef STK_STATUS_NAME
	default:
		return "UNKNOWN";
	}
}
