// placeholder, replaced by the reference attention
#include "reference/attention_ref.hpp"
