#include "../../metal_emu.h"
